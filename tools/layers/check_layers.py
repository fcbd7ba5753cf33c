#!/usr/bin/env python3
"""Layer check: fails when a file includes a header from a layer it must not depend on.

The layers (docs/ARCHITECTURE.md draws them), lowest first. A file may include headers of its
own layer and of the layers listed as below it; nothing else of ours. System and third-party
headers (<...>) are not checked.

    kernels          kernels/
    engine core      engine/{core,memory,backend,ops,telemetry}      (one library: kvlab_core)
    engine modules   formats/{tokenizer,io,gguf}                      (kvlab_tokenizer/modelio/gguf)
    engine dist      engine/dist/  over engine core (kvlab_dist: MPI/NCCL); train stands on it
    engine           the rest of engine/ (kvlab_engine), bottom-up:
                       model < kv < driver < data, grad < run < generate, train
    storage          storage/        over engine core only (the telemetry record vocabulary)
    sessions         sessions/       over engine and storage
    views            views/          over storage only (no engine, no sessions)
    bench            bench/          over everything but app/
    app, python, tests, fuzz, tools  over everything

Policy knowledge stays in engine/kv (docs/ARCHITECTURE.md, "Policies stay in engine/kv"). In
the product folders outside it (POLICY_FREE below) a file may not
    - include an engine/kv header that belongs to one policy (its file name has a registered
      policy's name, or the first word of one, as a word: quest_policy.h, policy_cake.h, ...);
    - use an identifier with a registered policy's name as a word (quest_page, CakeBudgets,
      set_quest), except names that are ordinary words too (ORDINARY_WORDS);
    - compare a string with a policy's name or a cache name of it (== "quest", != "h2o-default",
      find_policy("cake"), .rfind("duo", 0));
    - name a capability: a member declared in engine/kv headers between the markers
      "---- capabilities" and "---- end of capabilities" (pool_slots, selects_reads, needs_*, ...).
The registered names are read from the policy files' descriptors (`.name = "..."` in
engine/kv/policies/policy_*.cpp), the capabilities from the markers, so neither list is kept here.
Strings and comments may name policies: the views show them as data.

Usage: check_layers.py SOURCE_ROOT [build/compile_commands.json]
       check_layers.py --self-test   (the check reports each kind of violation, passes a clean tree)
With a compile database, every translation unit it lists must also be a file this check saw
(so a new top-level folder cannot slip past the table). Prints one line per violation.
"""
import json
import os
import re
import sys

CORE = ("engine/core/", "engine/memory/", "engine/backend/", "engine/ops/", "engine/telemetry/")
MODULES = ("formats/tokenizer/", "formats/io/", "formats/gguf/")
BASE = ("kernels/",) + CORE + MODULES  # what every folder of the engine proper stands on

# (name, path prefixes that belong to it, prefixes it may include)
LAYERS = [
    ("kernels", ("kernels/",), ("kernels/",)),
    ("engine core", CORE, ("kernels/",) + CORE),
    # Each module stands alone on the core (no module includes another, nor the engine proper).
    ("formats/tokenizer", ("formats/tokenizer/",), ("kernels/",) + CORE + ("formats/tokenizer/",)),
    ("formats/io", ("formats/io/",), ("kernels/",) + CORE + ("formats/io/",)),
    ("formats/gguf", ("formats/gguf/",), ("kernels/",) + CORE + ("formats/gguf/",)),
    # The engine proper, bottom-up: each folder may include the ones listed before it.
    ("engine/model", ("engine/model/",), BASE + ("engine/model/",)),
    ("engine/kv", ("engine/kv/",), BASE + ("engine/model/", "engine/kv/")),
    ("engine/driver", ("engine/driver/",), BASE + ("engine/model/", "engine/kv/", "engine/driver/")),
    ("engine/data", ("engine/data/",), BASE + ("engine/model/", "engine/kv/", "engine/driver/", "engine/data/")),
    ("engine/grad", ("engine/grad/",), BASE + ("engine/model/", "engine/kv/", "engine/driver/", "engine/grad/")),
    ("engine/run", ("engine/run/",), BASE + ("engine/model/", "engine/kv/", "engine/driver/", "engine/data/", "engine/run/")),
    ("engine/generate", ("engine/generate/",),
     BASE + ("engine/model/", "engine/kv/", "engine/driver/", "engine/data/", "engine/run/", "engine/generate/")),
    ("engine/dist", ("engine/dist/",), ("kernels/",) + CORE + ("engine/dist/",)),
    ("engine/train", ("engine/train/",),
     BASE + ("engine/model/", "engine/kv/", "engine/driver/", "engine/data/", "engine/grad/", "engine/run/", "engine/dist/",
             "engine/train/")),
    ("engine", ("engine/",), ("kernels/", "formats/", "engine/")),
    ("storage", ("storage/",), CORE + ("storage/",)),
    ("sessions", ("sessions/",), ("kernels/", "formats/", "engine/", "storage/", "sessions/")),
    ("views", ("views/",), ("storage/", "views/")),
    ("plot", ("plot/",), ("plot/",)),
    ("bench", ("bench/",), ("kernels/", "formats/", "engine/", "storage/", "sessions/", "views/", "bench/")),
    ("app", ("app/",), None),
    ("python", ("python/",), None),
    ("tests", ("tests/",), None),
    ("fuzz", ("fuzz/",), None),
    ("tools", ("tools/",), None),
]
SOURCE_EXT = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of(rel):
    for name, owns, allowed in LAYERS:
        if rel.startswith(owns):
            return name, allowed
    return None, None


def resolve(root, rel_file, inc):
    """Repository-relative path of a quoted include (as the compiler finds it: the including
    file's folder first, then the repository root, the one include directory we add)."""
    local = os.path.normpath(os.path.join(os.path.dirname(rel_file), inc))
    if os.path.exists(os.path.join(root, local)):
        return local
    if os.path.exists(os.path.join(root, inc)):
        return os.path.normpath(inc)
    return None  # generated or third-party (e.g. a moc file): not ours to check


def check(root, seen=None):
    """Violations (one line each) among the files under the layers' folders of root."""
    seen = set() if seen is None else seen
    violations = []
    names, caps = policy_names(root), capability_names(root)
    if os.path.isdir(os.path.join(root, "engine/kv")) and not (names and caps):
        # a check that finds nothing to look for passes vacuously: say so instead
        violations.append("engine/kv: found %d registered policy names and %d capability members; "
                          "expected both (policy descriptors in engine/kv/policies/policy_*.cpp, "
                          "capability markers in engine/kv headers)" % (len(names), len(caps)))
    for top in sorted({owns for _, prefixes, _ in LAYERS for owns in prefixes}):
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames[:] = [d for d in dirnames if d not in ("build", "corpus", "fixtures")]
            for fn in filenames:
                if not fn.endswith(SOURCE_EXT):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, fn), root)
                if rel in seen:
                    continue
                seen.add(rel)
                name, allowed = layer_of(rel)
                if allowed is None and not rel.startswith(POLICY_FREE):
                    continue
                with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
                    text = f.read()
                if rel.startswith(POLICY_FREE) and not rel.startswith(POLICY_TOOLS):
                    violations += policy_violations(root, rel, text, names, caps)
                if allowed is None:
                    continue
                for m in INCLUDE.finditer(text):
                    target = resolve(root, rel, m.group(1))
                    if target is None or target.startswith(allowed):
                        continue
                    line = text.count("\n", 0, m.start()) + 1
                    tname, _ = layer_of(target)
                    violations.append(f"{rel}:{line}: {name} includes {target} ({tname or 'outside every layer'})")
    return violations


# Folders whose code must not know which policy runs (tests, benchmarks, tools and fuzzers
# exercise particular policies on purpose; the engine core and kernels hold ops, not policies).
POLICY_FREE = ("engine/driver/", "engine/data/", "engine/grad/", "engine/run/", "engine/generate/", "engine/train/",
               "storage/", "sessions/", "views/", "plot/", "app/", "python/src/")
# Code that exists for one policy or op by design, like tests: `kvlab calibrate duo` (the gate
# file of duo), `kvlab calibrate qfilter` (the filter file of qfilter) and the benchmark program kvlab-bench (app/bench/, e.g. `kvlab bench quest`: the
# SDPA_QUEST op against full attention), a front end of bench/.
POLICY_TOOLS = ("app/cli/cmd_calibrate.cpp", "app/cli/calibrate_qfilter.cpp", "app/bench/")
# Registered names that are also ordinary words in identifiers (dense attention, random numbers,
# streaming text, a cursor): checked in includes and string comparisons only.
ORDINARY_WORDS = {"dense", "random", "streaming", "cur"}
# The uncompressed cache every comparison is measured against: the sweep, metrics and plots find
# the reference run by this name, so comparing with it is not knowledge of a policy.
REFERENCE = "dense"
CAP_BEGIN = re.compile(r"//\s*-+\s*capabilities\b")
CAP_END = re.compile(r"//\s*-+\s*end of capabilities\b")
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
STRING_COMPARE = re.compile(r'(?:[=!]=\s*(?:\w+\()?"([^"\\\n]*)"|"([^"\\\n]*)"\)?\s*[=!]=|'
                            r'(?:find_policy|rfind|starts_with|compare)\(\s*(?:\w+\()?"([^"\\\n]*)")')


def words(name):
    """The words of an identifier or file name: snake_case, camelCase and hyphens split."""
    name = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return [w for w in re.split(r"[_\-.]", name.lower()) if w]


def contains(seq, sub):
    return any(seq[i:i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


def kv_files(root, pred):
    """engine/kv's files (the core, policies/, buffers/) whose name pred accepts, as (rel, path)."""
    kv = os.path.join(root, "engine/kv")
    for dirpath, dirnames, filenames in os.walk(kv):
        dirnames.sort()
        for fn in sorted(filenames):
            if pred(fn):
                path = os.path.join(dirpath, fn)
                yield os.path.relpath(path, root).replace(os.sep, "/"), path


def policy_names(root):
    """The registered policies (the descriptors' names in engine/kv/policies/policy_*.cpp)."""
    names = set()
    for _, path in kv_files(root, lambda fn: fn.startswith("policy_") and fn.endswith(".cpp")):
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        # a policy descriptor names its policy before its summary (options have a help)
        names.update(re.findall(r'\.name\s*=\s*"([^"]+)",\s*\n?\s*\.summary', text))
    return names


def capability_names(root):
    """Members declared between the capability markers of engine/kv's headers."""
    caps = {}
    for rel, path in kv_files(root, lambda fn: fn.endswith(".h")):
        inside, block = False, []
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if CAP_END.search(line):
                    inside = False
                    for name in declared_names("".join(block)):
                        caps[name] = rel
                    block = []
                elif CAP_BEGIN.search(line):
                    inside = True
                elif inside:
                    block.append(line.split("//")[0])
    return caps


def declared_names(code):
    """The members a run of C++ declarations declares: the name before each top-level "(" (a
    function; "(*name)" for a function pointer), or the last name before a top-level "=" or ";"
    of a declaration without one (a field)."""
    names, depth, start, has_call = [], 0, 0, False
    for i, c in enumerate(code):
        if c in "({":
            if c == "(" and depth == 0 and not has_call:
                rest = code[i + 1:].lstrip()
                m = re.match(r"\*\s*(\w+)", rest) if rest.startswith("*") else re.search(r"(\w+)\s*$", code[start:i])
                if m:
                    names.append(m.group(1))
                has_call = True
            depth += 1
        elif c in ")}":
            depth -= 1
            if c == "}" and depth == 0:  # the end of a body or of a braced initializer
                start, has_call = i + 1, False
        elif depth == 0 and (c == ";" or c == "=" and not has_call):
            if not has_call:
                m = re.search(r"(\w+)\s*$", code[start:i])
                if m:
                    names.append(m.group(1))
            if c == ";":
                start, has_call = i + 1, False
            else:
                has_call = True  # what follows "=" is the initializer
    return set(names) - {"const", "override", "return", "default"}


LITERAL_OR_COMMENT = re.compile(r'//[^\n]*|/\*.*?\*/|\bR"([^(\s"]*)\(.*?\)\1"|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)


def strip_code(text):
    """text with comments and string/char literals blanked (line numbers kept)."""
    def blank(m):
        t = m.group(0)
        keep = '""' if t[0] in "R\"" else "''" if t[0] == "'" else ""
        return keep + "\n" * t.count("\n")
    return LITERAL_OR_COMMENT.sub(blank, text)


def strip_comments(text):
    """text with comments blanked, strings kept (for the string comparisons)."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r'//[^\n]*', "", text)  # (a "//" inside a string rarely precedes a comparison)


def policy_violations(root, rel, text, names, caps):
    """Policy knowledge in a POLICY_FREE file: one line per finding."""
    found = []
    name_words = {n: words(n) for n in names}
    heads = {words(n)[0] for n in names}
    for m in INCLUDE.finditer(text):
        inc = m.group(1)
        target = resolve(root, rel, inc) or inc
        if not target.startswith("engine/kv/"):
            continue
        w = words(os.path.basename(target).rsplit(".", 1)[0])
        hit = next((h for h in sorted(heads) if h in w), None)
        if hit:
            line = text.count("\n", 0, m.start()) + 1
            found.append(f"{rel}:{line}: includes {target}, a header of one policy ('{hit}'); reach it through engine/kv's generic API")
    code = strip_code(text)
    checked = {n: nw for n, nw in name_words.items() if n not in ORDINARY_WORDS}
    verdicts = {}  # identifier -> finding text or None (each identifier is judged once per file)
    for m in IDENT.finditer(code):
        ident = m.group(0)
        if ident not in verdicts:
            verdict = None
            if ident in caps:
                verdict = f"names the capability '{ident}' ({caps[ident]}); only engine/kv may test or call it"
            else:
                w = words(ident)
                hit = next((n for n, nw in checked.items() if contains(w, nw)), None)
                if hit:
                    verdict = f"identifier '{ident}' names the policy '{hit}'; policy code belongs in engine/kv"
            verdicts[ident] = verdict
        if verdicts[ident]:
            found.append(f"{rel}:{code.count(chr(10), 0, m.start()) + 1}: {verdicts[ident]}")
    plain = strip_comments(text)
    for m in STRING_COMPARE.finditer(plain):
        lit = next(g for g in m.groups() if g is not None)
        for n in names - {REFERENCE}:
            if lit == n or lit.startswith(n + "-") and not any(lit.startswith(o + "-") or lit == o for o in names if len(o) > len(n)):
                line = plain.count("\n", 0, m.start()) + 1
                found.append(f"{rel}:{line}: compares a string with the policy '{n}' (\"{lit}\"); branch on the registry instead")
                break
    return found


def self_test():
    """The check must fail on each kind of violation and pass a clean tree."""
    import tempfile

    cases = {
        "views/a.h": ('#include "engine/kv/kv_policy.h"\n', True),
        "views/b.cpp": ('#include "sessions/run_manager.h"\n', True),
        "storage/c.cpp": ('#include "engine/kv/kv_policy.h"\n', True),
        "formats/io/d.h": ('#include "engine/model/transformer.h"\n', True),
        "engine/core/e.cpp": ('#include "engine/kv/kv_policy.h"\n', True),
        "kernels/f.cpp": ('#include "engine/core/tensor.h"\n', True),
        "engine/kv/g.cpp": ('#include "storage/rows.h"\n', True),
        "engine/model/h.cpp": ('#include "engine/kv/kv_policy.h"\n', True),
        "views/ok.cpp": ('#include "storage/rows.h"\n#include "views/a.h"\n#include <vector>\n', False),
        # policy knowledge outside engine/kv: a policy's header, identifier, string comparison, capability
        "engine/driver/p1.cpp": ('#include "engine/kv/policies/quest_policy.h"\n', True),
        "engine/grad/p2.cpp": ("int quest_page = 0;\n", True),
        "sessions/p3.cpp": ('bool f(const std::string& s) { return s == "quest-default"; }\n', True),
        "engine/run/p4.cpp": ("long f(kv::KVPolicy& p) { return p.pool_slots(); }\n", True),
        "app/p5.cpp": ("auto f = &PolicyInfo::read_selection;\n", True),
        "views/p6.cpp": ('bool g(const std::string& s) { return QuestThing(s).ok(); }\n', True),
        # ... but a policy's name as data or in a comment, and the dense reference, are fine
        "views/ok2.cpp": ('const char* n = "quest";  // quest_page\nbool d(const std::string& s) { return s == "dense"; }\n', False),
        "engine/run/ok3.cpp": ('#include "engine/kv/kv_policy.h"\nlong f(kv::KVPolicy& p) { return p.position_row_length(); }\n', False),
        "app/ok.cpp": ('#include "sessions/run_manager.h"\n#include "views/a.h"\n', False),
    }
    headers = ["engine/kv/kv_policy.h", "sessions/run_manager.h", "engine/model/transformer.h",
               "engine/core/tensor.h", "storage/rows.h", "engine/kv/policies/quest_policy.h"]
    # a registry of one policy, and capabilities between the markers of engine/kv headers
    fixtures = {
        "engine/kv/policies/policy_quest.cpp": '{.name = "quest",\n .summary = "reads pages", .options = {{.name = "quest_page_size", .help = ""}}}\n',
        "engine/kv/kv_policy.h": ("class KVPolicy {\n    // ---- capabilities (engine/kv only) ----\n"
                                  "    virtual long pool_slots() const { return 0; }\n    // ---- end of capabilities ----\n"
                                  "    long position_row_length() const;\n};\n"),
        "engine/kv/policies/policy_registry.h": ("struct PolicyInfo {\n    // ---- capabilities ----\n"
                                        "    std::unique_ptr<ReadSelection> (*read_selection)(const KVCacheConfig& cfg) = nullptr;\n"
                                        "    // ---- end of capabilities ----\n};\n"),
    }
    failures = 0
    with tempfile.TemporaryDirectory() as d:
        for h in headers:
            os.makedirs(os.path.join(d, os.path.dirname(h)), exist_ok=True)
            open(os.path.join(d, h), "w").close()
        for path, text in fixtures.items():
            with open(os.path.join(d, path), "w") as f:
                f.write(text)
        for path, (text, _) in cases.items():
            os.makedirs(os.path.join(d, os.path.dirname(path)), exist_ok=True)
            with open(os.path.join(d, path), "w") as f:
                f.write(text)
        found = {v.split(":")[0] for v in check(d)}
        for path, (_, bad) in cases.items():
            if (path in found) != bad:
                print(f"self-test: {path} {'not reported' if bad else 'reported'} ({cases[path][0].strip()})")
                failures += 1
        # the same tree without its policy registry: the check must say it has nothing to look for
        os.remove(os.path.join(d, "engine/kv/policies/policy_quest.cpp"))
        if not any(v.startswith("engine/kv: found 0 registered policy names") for v in check(d)):
            print("self-test: a tree without policy descriptors passed the policy check vacuously")
            failures += 1
    print(f"check_layers self-test: {len(cases) + 1} cases, {failures} wrong")
    return 1 if failures else 0


def main():
    if len(sys.argv) == 2 and sys.argv[1] == "--self-test":
        return self_test()
    if len(sys.argv) < 2:
        print("usage: check_layers.py SOURCE_ROOT [compile_commands.json]", file=sys.stderr)
        return 2
    root = os.path.abspath(sys.argv[1])
    seen = set()
    violations = check(root, seen)
    if len(sys.argv) > 2:
        with open(sys.argv[2]) as f:
            for entry in json.load(f):
                path = os.path.abspath(os.path.join(entry.get("directory", ""), entry["file"]))
                if not path.startswith(root + os.sep):
                    continue
                rel = os.path.relpath(path, root)
                if rel.startswith("build") or "/build/" in rel or not os.path.exists(path):
                    continue  # generated, or a stale entry of a file moved since the last configure
                if rel not in seen:
                    violations.append(f"{rel}: compiled but in no layer of tools/layers/check_layers.py; add its folder to the table")
    for v in violations:
        print(v)
    print(f"check_layers: {len(seen)} files, {len(violations)} violation(s)")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
