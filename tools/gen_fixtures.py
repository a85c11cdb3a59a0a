#!/usr/bin/env python3
"""Regenerates the conformance fixtures: `fixtures/<op>/<case>.safetensors` + `MANIFEST.json`.

    python3 tools/gen_fixtures.py --out fixtures [--ops OP ...] [--cases GLOB] [--device cuda|cpu]
    python3 tools/gen_fixtures.py --out fixtures --manifest-only

Every case is checked against its float64 oracle before it is written (a disagreeing case is
refused and the command exits 1). With `--device cpu` the cases that need a GPU (FLA Triton,
torch CUDA, SDPA flash) are skipped and the files already in `--out` are kept. The manifest is
rebuilt from every case file under `--out`. See `tools/README.md`.
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib.util
import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from fixturegen import cumsum, decode  # noqa: E402,F401  (registers the cases)
from fixturegen.case import (AUTOTUNE_ENV, KNOWN_FAILURE, RefusedCase, device_name,  # noqa: E402
                             read_metadata, write, write_manifest)
from fixturegen.registry import CASES, Ctx  # noqa: E402

try:  # native sparse attention cases (issue 13)
    from fixturegen import nsa  # noqa: E402,F401
except ImportError as e:  # pragma: no cover
    if "nsa" not in str(e):
        raise

from fixturegen import flashqla  # noqa: E402,F401  (FlashQLA gdn_fwd cases; need flash_qla)

try:  # delta-rule cases (issue 3) register themselves when present
    from fixturegen import delta_rule  # noqa: E402,F401
except ImportError as e:  # pragma: no cover
    if "delta_rule" not in str(e):
        raise


def use_first_autotune_config() -> None:
    """Make every Triton autotuner keep the first config that survives its own pruning.

    Fixtures need a correct kernel, not the fastest one; compiling and timing every config of
    FLA's autotuned KDA/GDN kernels for every case shape takes minutes of GPU time.
    """
    from triton.runtime.autotuner import Autotuner

    prune = Autotuner.prune_configs

    def first_config(self, kwargs, *rest):
        return prune(self, kwargs, *rest)[:1]

    Autotuner.prune_configs = first_config
    os.environ[AUTOTUNE_ENV] = "first-config"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("fixtures"))
    ap.add_argument("--ops", nargs="*", help="op ids to generate (default: all)")
    ap.add_argument("--cases", default="*", help="glob on case names (default: all)")
    ap.add_argument("--device", choices=["cuda", "cpu"],
                    default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--quick-autotune", action="store_true",
                    help="Triton autotuners time only the first config that survives pruning "
                         "(every config computes the same op; this skips compiling the others)")
    ap.add_argument("--manifest-only", action="store_true",
                    help="only rebuild MANIFEST.json from the files under --out")
    args = ap.parse_args()

    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda asked but torch sees no GPU", file=sys.stderr)
        return 2
    # fp32 FLA cases are computed with IEEE fp32 products
    # (`conformance/spec/ops-delta-rule.md` §10.1).
    os.environ.setdefault("TRITON_F32_DEFAULT", "ieee")
    os.environ.pop("FLA_INTRACARD_CP", None)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    if args.quick_autotune:
        use_first_autotune_config()
    if args.manifest_only:
        print(f"wrote {write_manifest(args.out)}")
        return 0
    ops = set(args.ops) if args.ops else None
    unknown = (ops or set()) - {c.op for c in CASES}
    if unknown:
        print(f"unknown op(s): {sorted(unknown)}", file=sys.stderr)
        return 2
    chosen = [c for c in CASES
              if (ops is None or c.op in ops) and fnmatch.fnmatch(c.name, args.cases)]
    if args.list:
        for c in chosen:
            print(f"{c.op}/{c.name}{'  [cuda]' if c.needs_cuda else ''}"
                  f"{f'  [{c.needs_module}]' if c.needs_module else ''}")
        return 0

    ctx = Ctx(args.device, device_name(args.device))
    written, skipped, failed, known = 0, 0, [], []
    for c in chosen:
        if c.needs_cuda and args.device != "cuda":
            skipped += 1
            print(f"skip {c.op}/{c.name}: needs the GPU (--device cuda)")
            continue
        if c.needs_module and importlib.util.find_spec(c.needs_module) is None:
            skipped += 1
            print(f"skip {c.op}/{c.name}: needs the Python module {c.needs_module} "
                  "(tools/flashqla/README.md)")
            continue
        try:
            path = write(c.build(ctx), args.out)
            written += 1
            if KNOWN_FAILURE in read_metadata(path):
                known.append(f"{c.op}/{c.name}")
        except RefusedCase as e:
            failed.append(f"{c.op}/{c.name}")
            print(f"REFUSED {e}")
        except Exception:  # a broken case must not stop the others
            failed.append(f"{c.op}/{c.name}")
            print(f"ERROR {c.op}/{c.name}:")
            traceback.print_exc(file=sys.stdout)
    if args.out.exists():
        write_manifest(args.out)
    print(f"{written} written ({len(known)} kept as known failures"
          + (f": {known}" if known else "") + f"), {skipped} skipped (need a GPU or a module), "
          f"{len(failed)} failed" + (f": {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
