// Renders chat templates with @huggingface/jinja, the oracle for fireline's Jinja interpreter.
//   node render_chat_templates.mjs JOBS.json OUT.json
// JOBS.json: {"now": [Y, M, D, h, m, s], "templates": {"id": "source", ...},
//             "jobs": [{"id": "...", "template": "id", "context": {...}}, ...]}
// OUT.json:  {"job id": {"ok": true, "text": "..."} | {"ok": false, "error": "..."}, ...}
// strftime_now() reads the clock through Date, so Date is pinned to the given local time.
import { readFileSync, writeFileSync } from "node:fs";
import { Template } from "@huggingface/jinja";

const [jobsPath, outPath] = process.argv.slice(2);
if (!jobsPath || !outPath) {
  console.error("usage: node render_chat_templates.mjs JOBS.json OUT.json");
  process.exit(2);
}
const input = JSON.parse(readFileSync(jobsPath, "utf8"));

if (input.now) {
  const [y, mo, d, h, mi, s] = input.now;
  const RealDate = Date;
  const fixed = new RealDate(y, mo - 1, d, h, mi, s).getTime();
  globalThis.Date = class extends RealDate {
    constructor(...args) {
      if (args.length === 0) super(fixed);
      else super(...args);
    }
    static now() {
      return fixed;
    }
  };
}

const compiled = new Map();
const results = {};
for (const job of input.jobs) {
  try {
    let template = compiled.get(job.template);
    if (template === undefined) {
      try {
        template = new Template(input.templates[job.template]);
      } catch (e) {
        template = e;
      }
      compiled.set(job.template, template);
    }
    if (template instanceof Error) throw template;
    results[job.id] = { ok: true, text: template.render(job.context) };
  } catch (e) {
    results[job.id] = { ok: false, error: String(e && e.message ? e.message : e) };
  }
}
writeFileSync(outPath, JSON.stringify(results));
