#!/usr/bin/env python3
"""Attribute a profiled kernel's samples to the lines of one of its source functions.

Nsight Compute's source page (`ncu_source.py`) locates the time by SASS instruction index; a
kernel NVRTC compiled without line information says nothing of which source line that is. This
tool rebuilds the map offline: compile the module here with `-lineinfo` (the same sources and
options, e.g. with the ptxas of the CUDA wheel), disassemble it with `nvdisasm -gi`, and give it
the region lines of `ncu_source.py`'s output (`START- END samples S% executed E% ...`). Each
instruction is charged to the line of FUNCTION that (directly or through inlined calls) produced
it; a region's samples are spread over its instructions' lines in proportion. The JIT of the
device and a local ptxas may differ by a few instructions (S10: 18880 against 18848 for
`kda_intra_mma_fast_bf16`): regions of a few hundred instructions absorb that.

    nvdisasm -gi module.cubin > module.sass
    python3 tools/sass_lines.py --sass module.sass --kernel kda_intra_mma_fast_bf16 \\
        --sources gpu/kernels/{common.cuh,gate.cuh,fwd_h.cuh,kda_intra.cu} \\
        --function intra_mma --regions profile_ROW.src.txt

The sources are listed in the order the module concatenates them (gpu/src/kernels.rs), so that
the compiler's line numbers can be mapped back to a file and line.
"""
import argparse
import collections
import re
import sys

LOC = re.compile(r'\s*//## File ".*?", line (\d+)')
INST = re.compile(r'\s*/\*([0-9a-f]+)\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)')
REGION = re.compile(r'\s*(\d+)-\s*(\d+)\s+samples\s+([\d.]+)%\s+executed\s+([\d.]+)%')
FUNC = re.compile(r'^(?:template <.*>\s*)?(?:static\s+)?(?:extern "C"\s+)?__(?:device|global)__\b.*?(\w+)\s*\(')


def kernel_text(path, kernel):
    """The disassembly lines of `kernel`'s .text section."""
    out, inside = [], False
    for ln in open(path):
        if ln.startswith(".text."):
            inside = ln.strip() == f".text.{kernel}:"
            continue
        if inside:
            out.append(ln)
    if not out:
        sys.exit(f"no section .text.{kernel} in {path}")
    return out


def instructions(text):
    """Per SASS instruction: (opcode, its location chain, innermost frame first)."""
    insts, chain, pending = [], [], []
    for ln in text:
        m = LOC.match(ln)
        if m:
            pending.append(int(m.group(1)))
            continue
        m = INST.match(ln)
        if m:
            if pending:
                chain, pending = pending, []
            insts.append((m.group(2), chain))
    return insts


class Sources:
    """The concatenated sources: a compiler line number → (file, line, text, function)."""

    def __init__(self, paths):
        self.files = []
        start = 0
        for p in paths:
            lines = open(p).read().split("\n")
            funcs, cur = [], None
            for i, t in enumerate(lines, 1):
                m = FUNC.match(t)
                if m:
                    cur = m.group(1)
                funcs.append(cur)
            self.files.append((p, start, lines, funcs))
            start += len(lines) - 1  # the text after the last newline joins the next file's first line

    def where(self, n):
        for p, start, lines, funcs in reversed(self.files):
            if n > start:
                i = n - start
                if i <= len(lines):
                    return p, i, lines[i - 1].strip(), funcs[i - 1]
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sass", required=True, help="nvdisasm -gi output of the module")
    ap.add_argument("--kernel", required=True, help="the kernel's symbol")
    ap.add_argument("--sources", nargs="+", required=True, help="the module's sources, in order")
    ap.add_argument("--function", required=True, help="the function whose lines to report")
    ap.add_argument("--regions", required=True, help="ncu_source.py output (its region lines)")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()

    src = Sources(args.sources)
    insts = instructions(kernel_text(args.sass, args.kernel))
    owner = []
    for _, chain in insts:
        line = None
        for n in chain:  # innermost first: keep the outermost frame inside FUNCTION
            w = src.where(n)
            if w and w[3] == args.function:
                line = w
        owner.append(line)
    samples, executed = collections.Counter(), collections.Counter()
    covered = 0.0
    for ln in open(args.regions):
        m = REGION.match(ln)
        if not m:
            continue
        a, b, s, e = int(m.group(1)), int(m.group(2)), float(m.group(3)), float(m.group(4))
        seg = owner[a:b]
        if not seg:
            continue
        covered += s
        for k, n in collections.Counter(seg).items():
            samples[k] += s * n / len(seg)
            executed[k] += e * n / len(seg)
    print(f"{args.kernel}: {len(insts)} SASS instructions; the listed regions hold {covered:.1f}% of the samples")
    print(f"{'samples':>8} {'executed':>8}  line of {args.function} (or the instructions outside it)")
    for k, s in samples.most_common(args.top):
        where = f"{k[0].split('/')[-1]}:{k[1]}  {k[2][:90]}" if k else "(outside the function)"
        print(f"{s:7.1f}% {executed[k]:7.1f}%  {where}")


if __name__ == "__main__":
    main()
