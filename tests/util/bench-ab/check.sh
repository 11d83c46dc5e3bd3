#!/usr/bin/env bash
# scripts/bench-ab on the CPU with the tiny built-in shape: two arms take turns and each gets a
# median and a change against the first; a failing arm is named with bench's error and makes the
# exit status 1; wrong arms are refused (2) before anything runs; --summary-only keeps summary.json
# alone; a run stopped by SIGTERM prints and keeps what it had and exits 124.
#   check.sh FIRELINE_BINARY SOURCE_DIR OUT_DIR
set -uo pipefail
fireline=$1 src=$2 out=$3
ab="$src/scripts/bench-ab"
bench=(--like tiny-gemma4-moe --format q8 --context 32 --prompt-tokens 8 --gen-tokens 4 --runs 1 --backend cpu)
fails=0
expect() {  # description, condition result
  if [ "$2" = 0 ]; then echo "ok: $1"; else echo "FAIL: $1"; fails=$((fails + 1)); fi
}
rm -rf "$out" && mkdir -p "$out"

text=$("$ab" --fireline "$fireline" --rounds 2 --out "$out/good" --metric decode_tok_s --metric prefill_tok_s \
  --arm base= --arm inorder='--branches off' -- "${bench[@]}")
rc=$?
echo "$text"
expect "two good arms exit 0" $([ $rc -eq 0 ]; echo $?)
expect "the first arm is the base" $(grep -Eq '^base +decode_tok_s +median +[0-9.]+ +base +runs [0-9.]+ [0-9.]+$' <<<"$text"; echo $?)
expect "the second arm's change" $(grep -Eq '^inorder +prefill_tok_s +median +[0-9.]+ +[-+][0-9.]+ % +runs [0-9.]+ [0-9.]+$' <<<"$text"; echo $?)
expect "every run's JSON kept" $([ -s "$out/good/base_2.json" ] && [ -s "$out/good/inorder_1.json" ]; echo $?)
expect "the summary names both arms" $(python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); sys.exit(0 if sorted({a["arm"] for a in s["arms"]}) == ["base", "inorder"] and all(len(a["runs"]) == 2 for a in s["arms"]) else 1)' "$out/good/summary.json"; echo $?)

text=$("$ab" --fireline "$fireline" --rounds 1 --out "$out/bad" --arm base= --arm bad='--gated-matvec maybe' -- "${bench[@]}")
rc=$?
echo "$text"
expect "a failing arm exits 1" $([ $rc -eq 1 ]; echo $?)
expect "the failing arm says why" $(grep -Eq '^bad .*FAILED 1: round 1: exit [0-9]+: .*gated-matvec' <<<"$text"; echo $?)
expect "the good arm still measured" $(grep -Eq '^base +decode_tok_s +median +[0-9.]+' <<<"$text"; echo $?)

# --summary-only: summary.json alone in --out, marked complete
"$ab" --fireline "$fireline" --rounds 1 --out "$out/only" --summary-only --arm base= -- "${bench[@]}" >/dev/null
rc=$?
expect "--summary-only exits 0" $([ $rc -eq 0 ]; echo $?)
expect "--summary-only writes summary.json alone" $([ "$(ls "$out/only")" = summary.json ]; echo $?)
expect "the finished summary is complete" $(python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); sys.exit(0 if s["complete"] is True and len(s["arms"][0]["runs"]) == 1 else 1)' "$out/only/summary.json"; echo $?)

# Stopped by a time limit (SIGTERM from timeout): the finished runs' lines and summary, exit 124.
# A stand-in bench that takes 0.2 s per run, so that 60 rounds outlast the 4 s limit.
slow="$out/slow-fireline"
printf '#!/bin/sh\nsleep 0.2\necho %s\n' "'{\"decode_tok_s\": 7.5}'" > "$slow" && chmod +x "$slow"
text=$(timeout 4 "$ab" --rounds 60 --out "$out/stopped" --arm a@"$slow"= --arm b@"$slow"= -- --like x)
rc=$?
echo "$text"
expect "a run stopped by SIGTERM exits 124" $([ $rc -eq 124 ]; echo $?)
expect "each finished run printed as it ended" $(grep -Eq '^round 1 a: decode_tok_s 7.5$' <<<"$text"; echo $?)
expect "the stopped run prints its medians" $(grep -q 'stopped early' <<<"$text" && grep -Eq '^b +decode_tok_s +median +7.5 +\+0.0 %' <<<"$text"; echo $?)
expect "the stopped run's summary is partial" $(python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); sys.exit(0 if s["complete"] is False and 1 <= len(s["arms"][0]["runs"]) < 60 else 1)' "$out/stopped/summary.json"; echo $?)

"$ab" --fireline "$fireline" --out "$out/refused" --arm a= --arm a='--branches off' -- "${bench[@]}" >/dev/null 2>"$out/dup.err"
expect "two arms of one name are refused" $([ $? -eq 2 ] && grep -q "share a name" "$out/dup.err"; echo $?)
"$ab" --fireline "$fireline" --out "$out/refused" --arm 'a b=' -- "${bench[@]}" >/dev/null 2>"$out/name.err"
expect "a name with a space is refused" $([ $? -eq 2 ]; echo $?)
"$ab" --out "$out/refused" --arm a@/nonexistent/fireline= -- "${bench[@]}" >/dev/null 2>"$out/bin.err"
expect "a missing binary is refused" $([ $? -eq 2 ] && grep -q "not an executable" "$out/bin.err"; echo $?)
[ ! -e "$out/refused" ]
expect "nothing ran for refused arms" $?

echo "$fails failed"
[ $fails -eq 0 ]
