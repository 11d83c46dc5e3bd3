#!/usr/bin/env python3
"""Renders chat templates with Python Jinja2 configured exactly as Hugging Face transformers does
(ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, the {% generation %}
tag, tojson = json.dumps(ensure_ascii=False), raise_exception and strftime_now globals). It is
the second oracle for fireline's interpreter: where @huggingface/jinja and this disagree, the
test decides which one is right (see jinja_oracle_test.cpp).

    python3 render_jinja2.py JOBS.json OUT.json     (same formats as tests/js/render_chat_templates.mjs)
"""
import json
import sys
from datetime import datetime

import jinja2
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment


class GenerationTag(Extension):
    """transformers' AssistantTracker without the tracking: {% generation %} renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env(now):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return now.strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    jobs_path, out_path = sys.argv[1], sys.argv[2]
    with open(jobs_path, encoding="utf-8") as f:
        data = json.load(f)
    now = datetime(*data["now"]) if data.get("now") else datetime.now()
    env = make_env(now)
    compiled = {}
    results = {}
    for job in data["jobs"]:
        try:
            tid = job["template"]
            if tid not in compiled:
                try:
                    compiled[tid] = env.from_string(data["templates"][tid])
                except Exception as e:  # a syntax error fails every job of this template
                    compiled[tid] = e
            template = compiled[tid]
            if isinstance(template, Exception):
                raise template
            results[job["id"]] = {"ok": True, "text": template.render(**job["context"])}
        except Exception as e:
            results[job["id"]] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(results, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
