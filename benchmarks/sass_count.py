"""SASS instructions per input element of the NVFP4 quantize pass, split by role, without a GPU.

Usage:
    python benchmarks/sass_count.py [--dtype bf16] [--rht] [--sr] [--listing]   (sm_90 only: see main)

Builds native/cuda/nvfp4.cu as NVRTC would (`native._compile.nvcc_command`, the defines of the config,
plus -lineinfo, which adds line tables and changes no instruction), disassembles `nvfp4_quantize_<dtype>`
with `nvdisasm -gi` (nvdisasm / cuobjdump: CUDA toolkit, or pip nvidia-cuda-nvdisasm), and walks ONE
iteration of the tile loop (the longest loop) on the common path: inner loops run their trip count (rowwise blocks and
colwise words per thread), a forward branch is taken iff its fall-through block holds a CALL (the
slow path of __frcp_rn), encode_words' has_nan fix-up, a line marked `// edge tile` (the guarded loads of a tile
at X's bottom or right edge) or `// one thread` (thread 0's draw of the next tile: one thread of 256, not the
per-thread path), or code inlined from a line whose comment ends with `slow path` (called from it: the RN encode
of a block holding a NaN or a |y| >= 7, which clamps first; amax_nan_of's NaN-ignoring amax of a block holding a
NaN); a constant move there does not count (the compiler hoists a slow path's constants into the blocks before it:
`MOV` / `IMAD.MOV` / `HFMA2.MMA -RZ, RZ` of an immediate). Each executed instruction gets a role from its opcode and
its chain of
inlined source functions; counts are divided by the thread's input elements per tile (both copies are
written from them). Source: docs/design.md §4.2; docs/performance.md §4 (the tables this prints).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from native._compile import CUDA_DIR, cu_path, defines_for, nvcc_command  # noqa: E402
from reference.formats import QuantConfig  # noqa: E402

TILE_ROWS, TILE_BYTES, THREADS = 128, 128, 256  # nvfp4.cu TILE_M, TILE_WORDS * 4, QUANT_THREADS
ELEM_BYTES = {"f32": 4, "bf16": 2, "f16": 2}
ROLES = (
    "load X (LDG)", "shared tile (STS/LDS/BAR)", "widen to fp32", "amax", "scale math (§5.1-§5.3)",
    "E2M1 encode (y = RN(x f), code, place)", "pack codes", "store codes + scales (STG)", "index math / control",
)
# Opcodes taken to run on the 16-lane integer/logic ALU pipe of an sm_90 SM sub-partition (half the
# issue rate; FFMA/FMUL/FADD/IMAD run on the 32-lane FMA pipes): an estimate, ncu's pipe counters decide.
ALU_OPCODES = {"LOP3", "IADD3", "SHF", "LEA", "ISETP", "FSETP", "FMNMX", "SEL", "FSEL", "PRMT", "IMNMX", "VIADDMNMX", "VIMNMX",
               "VIMNMX3", "HMNMX2", "VHMNMX",
               "PLOP3", "IABS", "FLO", "POPC", "BMSK", "SGXT"}
# A branch and its target; sm_100 also writes a uniform-predicate branch as `BRA.U !UP0, target` (conditional, with
# no `@` guard).
_BRANCH = re.compile(r"BRA(?:\.U)? (?:!?U?P\d, )?`\((\.L_x_\d+)\)")
# Functions whose instructions are the E2M1 encode (the element codes, their signs and their placement in a word).
ENCODE_FUNCS = ("e2m1_", "rne_sat", "grid_", "floor_mag", "add_rz", "sr_draw", "philox", "nibble_signs", "sign_masks",
                "row_signs", "column_signs", "block_signs", "byte_perm")
# A constant into a register (a move, or HFMA2.MMA -RZ * RZ + constant): the compiler hoists a slow path's constants
# into the blocks before it.
_NUM = r"-?(?:0x[0-9a-f]+|\d+(?:\.\d+)?(?:e[-+]?\d+)?)"
_CONST_MOVE = re.compile(rf"^(?:(?:MOV|UMOV|MOV32I|IMAD\.MOV(?:\.U32)?) \w+, (?:U?RZ, U?RZ, )?{_NUM}|HFMA2\.MMA \w+, -RZ, RZ, {_NUM}, {_NUM})$")
_PREDICATED_BRANCH = re.compile(r"^(?:@|BRA(?:\.U)? !?U?P\d, )")


def source_functions() -> dict[str, dict[int, str]]:
    """file name -> line -> the function whose body holds it (definition lines at column 0)."""
    out = {}
    for path in CUDA_DIR.glob("nvfp4.cu*"):
        cur, names = "?", {}
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if (line[:1].isalpha() or line[:1] == "_") and not line.startswith(("namespace", "struct", "enum", "typedef", "constexpr", "using")):
                m = re.match(r".*?\b([A-Za-z_]\w*)\s*\(", line)
                if m and m.group(1) not in ("static_assert", "NVFP4_INSTANTIATE", "NVFP4_VARIANT_INSTANTIATE"):
                    cur = m.group(1)
            if line.startswith("#define NVFP4_INSTANTIATE"):
                cur = "kernel"
            names[i] = cur
        out[path.name] = names
    return out


def _opcode(op: str) -> str:
    parts = op.split()
    return parts[1] if parts[0].startswith("@") else parts[0]


# Per-SM limits of sm_90 and sm_100 (CUDA occupancy calculator): 64K registers allocated per warp in units of
# 256, 228 KiB of shared memory with 1 KiB reserved per CTA, 64 warps, 32 CTAs.
SM_REGS, REG_UNIT, SM_SMEM, CTA_SMEM_RESERVED, SM_WARPS, SM_CTAS = 65536, 256, 228 * 1024, 1024, 64, 32


def ctas_per_sm(regs: int, smem: int, threads: int = THREADS) -> int:
    """Resident CTAs per SM for a kernel of `regs` registers a thread and `smem` bytes of shared memory."""
    warps = threads // 32
    warp_regs = -(-regs * 32 // REG_UNIT) * REG_UNIT
    return min(SM_REGS // (warp_regs * warps), SM_SMEM // (smem + CTA_SMEM_RESERVED), SM_WARPS // warps, SM_CTAS)


def resource_usage(config: QuantConfig, arch: str, fn: str, cubin: Path) -> dict[str, int]:
    """Build nvfp4.cu for `config` into `cubin` (with line info) and return ptxas's resource usage of kernel `fn`:
    registers, spill stores (bytes), smem (bytes)."""
    cmd = nvcc_command(cu_path("nvfp4.cu"), cubin, arch, defines_for(config))
    cmd[1:1] = ["-lineinfo", "-Xptxas=-v"]
    log = subprocess.run(cmd, check=True, capture_output=True, text=True).stderr
    usage = log[log.index(f"Compiling entry function '{fn}'"):]
    return {key: int(m.group(1)) if (m := re.search(pat, usage[:usage.find("Compiling", 10)])) else 0
            for key, pat in (("regs", r"Used (\d+) registers"), ("spill", r"(\d+) bytes spill stores"),
                             ("smem", r"(\d+) bytes smem"))}


def disassemble(config: QuantConfig, arch: str, fn: str, tmp: Path) -> tuple[str, dict[str, int]]:
    """The kernel's SASS with line info, and ptxas's resource usage of it (`resource_usage`)."""
    cubin = tmp / "nvfp4.cubin"
    res = resource_usage(config, arch, fn, cubin)
    txt = subprocess.run([shutil.which("nvdisasm") or "nvdisasm", "-c", "-gi", str(cubin)], check=True,
                         capture_output=True, text=True).stdout
    start = txt.index(f"//--------------------- .text.{fn} ")
    end = txt.find("//---------------------", start + 10)
    return txt[start:end if end > 0 else None], res


def parse(body: str):
    """[(address, instruction, [(file, line) innermost first])], {label: index}."""
    ins, labels, pending, chain = [], {}, [], []
    for line in body.splitlines():
        if m := re.match(r"^(\.L_x_\d+):", line):
            labels[m.group(1)] = len(ins)
        elif line.strip().startswith("//##"):
            if m := re.search(r'File "([^"]+)", line (\d+)', line):
                pending.append((Path(m.group(1)).name, int(m.group(2))))
        elif m := re.match(r"\s+/\*([0-9a-f]+)\*/\s+(.*?)\s*;", line):
            chain, pending = (pending or chain), []
            ins.append((int(m.group(1), 16), m.group(2), chain))
    return ins, labels


def count(body: str, trips: int, elems: int):
    funcs, src = source_functions(), {p.name: p.read_text().splitlines() for p in CUDA_DIR.glob("nvfp4.cu*")}
    ins, labels = parse(body)
    label_at = set(labels.values())

    def chain_funcs(k):
        return [funcs.get(f, {}).get(n, f) for f, n in ins[k][2]]

    def rare(k):  # NaN-only code (the has_nan fix-up), edge tiles, thread 0 alone, slow paths
        chain = [(f, n) for f, n in ins[k][2] if f in src]
        if chain and src[chain[0][0]][chain[0][1] - 1].endswith(("// edge tile", "// one thread")):
            return True
        # Inlined from a call on a `slow path` line (not the line's own branch / move instructions).
        if any(src[f][n - 1].endswith("slow path") for f, n in chain[1:]):
            return True
        return any("is_nan(v[e])" in src[f][n - 1] or ("ELEM_NAN_CODE" in src[f][n - 1] and "word" in src[f][n - 1])
                   for f, n in chain)

    def role(k):
        opc = _opcode(ins[k][1])
        fs = chain_funcs(k)
        if opc.startswith("LDG"):
            return ROLES[0]
        if opc.startswith(("LDS", "STS", "BAR")):
            return ROLES[1]
        if opc.startswith("STG"):
            return ROLES[7]
        if set(fs) & {"block_scale", "block_scale_code", "table_scale", "encode_factor", "global_scale", "sat_e4m3", "ue4m3_value",
                          "rcp_rn"} or any("fp8" in f for f, _ in ins[k][2]):
            return ROLES[4]
        if fs[:2] in (["mul_rn", "encode_block"], ["mul_rn", "encode_words"]) or any(f.startswith(ENCODE_FUNCS) for f in fs):
            return ROLES[5]
        if fs and fs[0] == "encode_block" and "word" in src[ins[k][2][0][0]][ins[k][2][0][1] - 1]:
            return ROLES[6]
        if set(fs) & {"block_amax_nan", "fmax_nan", "block_amax", "pair_amax_nan"}:
            return ROLES[3]
        if set(fs) & {"widen", "column_values", "bf16_to_f32", "f16_to_f32", "rht16", "rht_butterfly", "rht_path", "round_bf16"}:
            return ROLES[2]
        return ROLES[8]

    first_exit = next(k for k, (_, op, _) in enumerate(ins) if op == "EXIT")
    backs = [(labels[m.group(1)], k) for k, (_, op, _) in enumerate(ins[:first_exit])
             if (m := _BRANCH.search(op)) and labels[m.group(1)] <= k]
    head, tail = max(backs, key=lambda b: b[1] - b[0])  # the tile loop: the longest loop
    trips_left = {k: trips for t, k in backs if k != tail}

    def walk(k, stop):
        """Instruction indices from k on the common path up to stop(k) (included), inner loops run `trips`
        times (the prologue's loops once: trips_left of a loop outside the tile loop is reset to 1)."""
        path = []
        while True:
            path.append(k)
            op = ins[k][1]
            if stop(k):
                return path
            if op.startswith("@") and _opcode(op) == "EXIT":  # the exit of a CTA without a tile: not taken
                k += 1
                continue
            if _opcode(op) == "EXIT" or "CALL" in op:  # (PREEXIT, griddepcontrol.launch_dependents, walks on)
                raise SystemExit(f"the walk reached {op} at {ins[k][0]:#x}")
            m = _BRANCH.search(op)
            if not m:
                k += 1
                continue
            target = labels[m.group(1)]
            if not _PREDICATED_BRANCH.match(op):
                k = target
            elif target <= k:  # an inner loop's back edge
                if trips_left[k] > 1:
                    trips_left[k] -= 1
                    k = target
                else:
                    trips_left[k] = trips if head <= k <= tail else 1
                    k += 1
            else:
                j, slow = k + 1, False
                while j < target and j not in label_at:  # rare: a constant move does not decide
                    if "CALL" in ins[j][1] or (rare(j) and not _CONST_MOVE.match(ins[j][1])):
                        slow = True
                        break
                    if "BRA" in ins[j][1]:
                        break
                    j += 1
                k = target if slow else k + 1

    path = walk(head, lambda k: k == tail)
    counts = Counter(role(k) for k in path)
    for _, k in backs:  # loops before or after the tile loop (the per-CTA setup) run once per thread
        if not head <= k <= tail:
            trips_left[k] = 1
    # Once per CTA: entry up to the tile loop, and from the loop's exit to EXIT (uniform branches
    # that skip the loop are not taken).
    once = walk(0, lambda k: k == head)[:-1] + walk(tail + 1, lambda k: ins[k][1] == "EXIT")
    return counts, [ins[i] for i in path], len(once)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--dtype", default="bf16", choices=sorted(ELEM_BYTES))
    ap.add_argument("--rht", action="store_true")
    ap.add_argument("--sr", action="store_true")
    ap.add_argument("--listing", action="store_true", help="print the walked instructions")
    a = ap.parse_args(argv)
    if a.arch != "sm_90":
        # The walk's rule for which way a forward branch goes (its fall-through holds a CALL, NaN-only or edge-tile
        # code) reproduces ncu's count on sm_90 (H200: 33.3 measured). On sm_100a the compiler interleaves the next
        # tile's edge-guarded copies into the colwise block, the rule skips that block, and the walk counts 149
        # instructions per tile: a wrong number, so none is printed.
        ap.error(f"--arch {a.arch}: the common-path walk is validated on sm_90 only (sm_100a's layout defeats its "
                 "branch rule); use sm_90")
    config = QuantConfig("nvfp4", rht=a.rht, stochastic=a.sr)
    per_row = TILE_BYTES // ELEM_BYTES[a.dtype]
    elems = TILE_ROWS * per_row // THREADS  # input elements per thread per tile
    trips = {"f32": 1, "bf16": 2, "f16": 2}[a.dtype]  # colwise words and rowwise blocks per thread
    with tempfile.TemporaryDirectory() as tmp:
        body, res = disassemble(config, a.arch, f"nvfp4_quantize_{a.dtype}", Path(tmp))
    counts, path, once = count(body, trips, elems)
    if a.listing:
        for addr, op, _ in path:
            print(f"{addr:05x} {op}")
    total = sum(counts.values())
    alu = sum(1 for _, op, _ in path if _opcode(op).split(".")[0] in ALU_OPCODES)
    print(f"nvfp4_quantize_{a.dtype} {a.arch} rht={a.rht} sr={a.sr}: {total} instructions per thread per tile, "
          f"{elems} input elements per thread")
    print(f"| {'role':40s} | per tile | per element |")
    for r in ROLES:
        print(f"| {r:40s} | {counts[r]:8d} | {counts[r] / elems:11.2f} |")
    print(f"| {'total':40s} | {total:8d} | {total / elems:11.2f} |")
    print(f"| {'of which ALU pipe (assumed)':40s} | {alu:8d} | {alu / elems:11.2f} |")
    print(f"once per CTA (entry to the tile loop, loop exit to EXIT): {once} instructions per thread; per element "
          f"with n tiles per CTA: {total / elems:.2f} + {once / elems:.2f} / n")
    print(f"ptxas: {res['regs']} registers, {res['spill']} bytes spill stores, {res['smem']} bytes smem: "
          f"{ctas_per_sm(res['regs'], res['smem'])} CTAs ({ctas_per_sm(res['regs'], res['smem']) * THREADS // 32} warps) "
          f"per SM")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
