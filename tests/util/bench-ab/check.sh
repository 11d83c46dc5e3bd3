#!/usr/bin/env bash
# scripts/bench-ab on the CPU with the tiny built-in shape: two arms take turns and each gets a
# median and a change against the first; a failing arm is named with bench's error and makes the
# exit status 1; wrong arms are refused (2) before anything runs.
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
