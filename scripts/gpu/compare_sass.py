"""Compares the machine code of two builds of _C_cuda.so function by function.

    python scripts/gpu/compare_sass.py OLD/_C_cuda.so NEW/_C_cuda.so

Runs `cuobjdump -sass` on both (cuobjdump is on the GPU machine), splits the
listings into functions by their mangled names, and prints, per function,
whether its code is identical, differs, or is only in one build. Exits 1 when
any function differs or is missing from the new build: a move of code that
must not change what a kernel computes is checked this way. A function whose
code differs only in where its build placed things (the offsets of calls to
non-inlined device functions, addresses in the module's constant bank) is
reported apart, as "relocated", and does not fail the check.
"""
import re
import subprocess
import sys


def functions(path: str) -> dict:
    out = subprocess.run(["cuobjdump", "-sass", path], capture_output=True, text=True,
                         check=True).stdout
    funcs, name, body, arch = {}, None, [], ""
    for line in out.splitlines():
        m = re.match(r"\s*arch = (\S+)", line)
        if m:
            arch = m.group(1)
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            if name:
                funcs[name] = body
            name, body = f"{arch}:{m.group(1)}", []
        elif name and re.match(r"\s*/\*[0-9a-f]{4,}\*/", line):
            body.append(line.strip())
    if name:
        funcs[name] = body
    return funcs


_PLACED = re.compile(r"(CALL\.REL(?:\.NOINC)?\s+)(?:`\S+`|0x[0-9a-f]+)|c\[0x4\]\[0x[0-9a-f]+\]")


def placement_free(body: list) -> list:
    """The instructions without their encodings, call targets and module
    constant-bank addresses: what stays when only the layout changed."""
    out = []
    for line in body:
        text = line.split(";")[0]
        out.append(_PLACED.sub(lambda m: (m.group(1) or "") + "<placed>", text))
    return out


def main(argv) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    old, new = functions(argv[0]), functions(argv[1])
    same = sorted(n for n in old if n in new and old[n] == new[n])
    differ = [n for n in old if n in new and old[n] != new[n]]
    moved = sorted(n for n in differ if placement_free(old[n]) == placement_free(new[n]))
    changed = sorted(n for n in differ if n not in moved)
    gone = sorted(n for n in old if n not in new)
    added = sorted(n for n in new if n not in old)
    for label, names in (("differs", changed), ("relocated", moved), ("only in old", gone),
                         ("only in new", added)):
        for n in names:
            print(f"{label:12s} {n}")
    print(f"{len(same)} functions identical, {len(moved)} relocated, {len(changed)} differ, "
          f"{len(gone)} only in old, {len(added)} only in new")
    return 1 if changed or gone else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
