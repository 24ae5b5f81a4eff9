#!/usr/bin/env bash
# Mutation testing (mutmut 3) of the package's Python files, failing unless every
# mutant is killed. Policy and exclusions: docs/adr/0005-mutation-testing.md.
#
#   scripts/mutation-changed.sh                the files changed since the merge base with
#                                              main (committed or not, and new files)
#   scripts/mutation-changed.sh --base REF     the files changed since REF
#   scripts/mutation-changed.sh --all          every module of the package
#   scripts/mutation-changed.sh FILE...        these files (CI: the decision modules)
#   ... --list                                 only print the files it would test
#
# The tests are the fast unit tests (tests/unit, [tool.mutmut] in pyproject.toml). Code
# only PostgreSQL can exercise carries `# pragma: no mutate` and an ADR 0005 row; it is
# tested by the integration contract tests instead. A timeout counts as a kill (the
# mutant hung the tests), as in mutmut's own score, and so does a crash of the test
# process (mutmut's "segfault": it ended by a signal). mutmut runs in a scratch copy of
# the work tree, so neither the tree nor its mutants/ is touched.
#
# Environment: PYTHON (default .venv/bin/python), MUTATION_JOBS (default: CPU count),
# MUTATION_KEEP=1 keeps the scratch copy (to inspect with `mutmut show NAME` there).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
python=${PYTHON:-$root/.venv/bin/python}
jobs=${MUTATION_JOBS:-$(nproc 2>/dev/null || echo 2)}

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//' >&2; exit "${1:-2}"; }

base="" all=0 list=0 files=()
while [ $# -gt 0 ]; do
    case "$1" in
        --base) [ $# -ge 2 ] || usage; base=$2; shift 2 ;;
        --base=*) base=${1#--base=}; shift ;;
        --all) all=1; shift ;;
        --list) list=1; shift ;;
        -h|--help) usage 0 ;;
        -*) echo "mutation: unknown option $1" >&2; usage ;;
        *) files+=("$1"); shift ;;
    esac
done

if [ "$all" = 1 ]; then
    mapfile -t files < <(git ls-files -- 'trioworker/*.py'; git ls-files --others --exclude-standard -- 'trioworker/*.py')
elif [ ${#files[@]} -eq 0 ]; then
    if [ -z "$base" ]; then
        main=main
        git rev-parse --verify --quiet "$main^{commit}" >/dev/null || main=origin/main
        base=$(git merge-base HEAD "$main") || { echo "mutation: no merge base with main; use --base REF" >&2; exit 2; }
    fi
    git rev-parse --verify --quiet "$base^{commit}" >/dev/null || { echo "mutation: unknown ref $base" >&2; exit 2; }
    mapfile -t files < <(
        git diff --name-only --diff-filter=d "$base" -- 'trioworker/*.py'
        git ls-files --others --exclude-standard -- 'trioworker/*.py'
    )
    echo "mutation: files changed since $(git rev-parse --short "$base")" >&2
fi
mapfile -t files < <(printf '%s\n' "${files[@]}" | sed '/^$/d' | sort -u)
for f in "${files[@]}"; do
    case "$f" in trioworker/*.py) ;; *) echo "mutation: $f is not a module of the package" >&2; exit 2 ;; esac
    [ -f "$f" ] || { echo "mutation: no such file $f" >&2; exit 2; }
done
if [ ${#files[@]} -eq 0 ]; then
    echo "mutation: no changed Python files in the package; nothing to test"
    exit 0
fi
if [ "$list" = 1 ]; then
    printf '%s\n' "${files[@]}"
    exit 0
fi
echo "mutation: ${files[*]}" >&2

scratch=$(mktemp -d "${TMPDIR:-/tmp}/trioworker-mutation.XXXXXX")
if [ "${MUTATION_KEEP:-0}" = 1 ]; then
    echo "mutation: scratch copy kept in $scratch" >&2
else
    trap 'rm -rf "$scratch"' EXIT
fi
cp -r trioworker tests migrations examples scripts pyproject.toml "$scratch"/
find "$scratch" -name __pycache__ -prune -exec rm -rf {} +
cd "$scratch"
"$python" - "${files[@]}" <<'EOF'
import json, pathlib, re, sys
path = pathlib.Path("pyproject.toml")
line = "only_mutate = " + json.dumps(sys.argv[1:])
if not re.search(r"(?m)^also_copy\s*=", path.read_text()):
    # Into mutants/: unit tests read a migration, and the sync client's generator.
    line += '\nalso_copy = ["migrations", "examples", "scripts"]'
text, n = re.subn(r"(?m)^only_mutate\s*=.*$", lambda _: line, path.read_text())
if n != 1:
    sys.exit("mutation: [tool.mutmut] in pyproject.toml needs exactly one one-line only_mutate")
path.write_text(text)
EOF

mutmut=$(dirname "$python")/mutmut
started=$(date +%s)
if ! "$mutmut" run --max-children "$jobs" >run.log 2>&1; then
    tr '\r' '\n' <run.log | tail -40 >&2
    echo "mutation: mutmut failed (its log is above)" >&2
    exit 1
fi
elapsed=$(( $(date +%s) - started ))

"$mutmut" results --all true >results.txt 2>&1
"$python" - "$elapsed" <<'EOF'
import collections, re, sys
counts = collections.defaultdict(collections.Counter)
bad = []
for line in open("results.txt"):
    m = re.match(r"\s*(\S+?)\.x[_ǁ]\S*: (.+)$", line.rstrip())
    if not m:
        continue
    module, status = m.groups()
    # A mutant that hung the tests (timeout) or crashed their process (segfault: any
    # signal: one that grew out of memory, say) did not pass them.
    status = {"timeout": "killed", "segfault": "killed",
              "caught by type check": "killed"}.get(status, status)
    counts[module][status] += 1
    if status not in ("killed", "skipped"):
        bad.append(line.strip())
total_killed = total_tested = 0
for module, c in sorted(counts.items()):
    tested = sum(c.values()) - c["skipped"]
    total_killed += c["killed"]
    total_tested += tested
    others = ", ".join(f"{n} {s}" for s, n in sorted(c.items()) if s not in ("killed", "skipped"))
    print(f"{module:32} {c['killed']:4}/{tested:<4} killed ({100 * c['killed'] / tested:5.1f}%)"
          + (f"  {others}" if others else ""))
if not total_tested:
    print("mutation: no mutants (no functions in these files?)")
    sys.exit(0)
print(f"{'all':32} {total_killed:4}/{total_tested:<4} killed"
      f" ({100 * total_killed / total_tested:.1f}%) in {sys.argv[1]}s")
if bad:
    print("\nNot killed (inspect with MUTATION_KEEP=1, then `mutmut show NAME` in the copy):")
    print("\n".join(bad))
    sys.exit(1)
EOF
