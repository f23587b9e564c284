"""Build Gluon kernels for sm_90 on a machine without a GPU, and read their SASS
(imported by the test modules).

Triton's wheel carries ptxas and cuobjdump, so a kernel compiles for a Hopper target
anywhere: what can be checked without running it (that it compiles with this Triton,
that its layout conversions are trivial, spills, the instructions it uses, and the
register hazard below) is checked in CI this way.

The hazard (``inflight_clobbers``): ``wgmma`` reads its A operand from registers
asynchronously until a ``wgmma.wait_group`` retires it; the compiler does not know, so
an instruction that writes one of those registers before the wait corrupts the product.
Seen on the H200: the next step's address arithmetic
reused the A registers of a wgmma left in flight across a loop's back edge.
"""
from __future__ import annotations

import functools
import importlib
import multiprocessing
import os
import re
import subprocess
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);",
                          re.M)
_REGISTER = re.compile(r"^-?\|?R(\d+)")


@dataclass(frozen=True)
class Instruction:
    address: int
    opcode: str
    operands: list[str]


@dataclass(frozen=True)
class Build:
    sass: str
    registers: int
    stack_bytes: int
    shared_bytes: int = 0   # shared memory a program asks at launch

    def instructions(self) -> list[Instruction]:
        return parse_sass(self.sass)

    def count(self, opcode: str) -> int:
        return sum(i.opcode.split(".")[0] == opcode for i in self.instructions())


def compile_sm90(kernel, signature: dict[str, str], constexprs: dict, num_warps: int,
                 **options) -> Build:
    """Compile a Gluon kernel (or a ``tamis.kernels._triton.kernel``) for sm_90a;
    ``signature`` gives each runtime argument's type ("*bf16", "i32", ...), every argument
    also taken as divisible by 16 (as Triton specialises pointers and strides at launch);
    ``options`` go to the compiler as a launch's would (``maxnreg`` ...).

    The compile runs in a child process (one for the whole test run), whose Triton is
    imported without TRITON_INTERPRET: the CPU tests' interpreter leaves triton.language
    patched after a nested jitted call (Triton 3.9), under which compiling fails, and
    makes constexpr functions return plain values. The child's stderr is closed: Triton
    3.9 prints a nanobind leak report at the exit of any process that compiled, which
    would otherwise follow pytest's summary line."""
    fn = kernel.fn
    try:
        return _child().submit(_compile, fn.__module__, fn.__name__, signature, constexprs,
                               num_warps, options).result()
    except _ChildError as exc:
        raise RuntimeError(f"compiling {fn.__name__} for sm_90 failed: {exc}") from None


class _ChildError(Exception):
    """A compile error, as text (Triton's own errors do not always pickle)."""


@functools.cache
def _child() -> ProcessPoolExecutor:
    return ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_quiet_child)


def _quiet_child() -> None:
    os.environ.pop("TRITON_INTERPRET", None)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)


def _compile(module: str, name: str, signature: dict[str, str], constexprs: dict,
             num_warps: int, options: dict) -> Build:
    import dataclasses

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    kernel = getattr(importlib.import_module(module), name)
    if hasattr(kernel, "params"):   # a Gluon kernel
        from triton.experimental.gluon._runtime import GluonASTSource
        source_class = GluonASTSource
    else:                           # a dual-mode Triton kernel: its function, jitted here
        kernel, source_class = JITFunction(kernel.fn), ASTSource
    names = [p.name for p in kernel.params]
    full = {name: signature.get(name, "constexpr") for name in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(names)
             if full[name] != "constexpr"}
    source = source_class(fn=kernel, signature=full, constexprs=constexprs, attrs=attrs)
    try:
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": num_warps, "enable_fp_fusion": True,
                                           **options})
    except Exception as exc:  # noqa: BLE001  (sent back as text)
        raise _ChildError(_error_chain(exc)) from None
    return dataclasses.replace(_read_cubin(compiled.asm["cubin"]),
                               shared_bytes=compiled.metadata.shared)


def _error_chain(exc: BaseException) -> str:
    """An error and its causes (Triton's CompilationError names only the call site of a
    nested jitted function; the error inside it is its cause)."""
    parts = []
    while exc is not None:
        parts.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__
    return "\n".join(parts)


def _read_cubin(cubin: bytes) -> Build:
    import tempfile

    import triton
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([str(tool), "-sass", f.name], capture_output=True, text=True,
                              check=True).stdout
        usage = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True,
                               text=True, check=True).stdout
    registers = int(re.search(r"REG:(\d+)", usage).group(1))
    stack = int(re.search(r"STACK:(\d+)", usage).group(1))
    return Build(sass, registers, stack)


def parse_sass(sass: str) -> list[Instruction]:
    """cuobjdump's SASS listing -> instructions (address, opcode with its modifiers,
    operands; predicates dropped)."""
    out = []
    for address, _, opcode, operands in _INSTRUCTION.findall(sass):
        ops = [o.strip() for o in operands.split(",")] if operands.strip() else []
        out.append(Instruction(int(address, 16), opcode, ops))
    return out


def _written_registers(ins: Instruction) -> set[int]:
    """The general registers an instruction writes: its first operand, 1, 2 or 4 wide
    by the opcode's modifiers. Stores, barriers, branches and the like write none."""
    base = ins.opcode.split(".")[0]
    if (base.startswith(("ST", "RED", "BAR", "BRA", "EXIT", "WARPGROUP", "DEPBAR", "LDGSTS",
                         "MEMBAR", "FENCE", "NOP", "CCTL", "ERRBAR", "LDGDEPBAR", "YIELD",
                         "RET", "CALL", "BSYNC", "BSSY", "WARPSYNC"))
            or not ins.operands):
        return set()
    dest = ins.operands[1] if base == "SHFL" and len(ins.operands) > 1 else ins.operands[0]
    match = _REGISTER.match(dest)  # SHFL writes a predicate, then its register
    if not match:
        return set()
    first = int(match.group(1))
    mods = ins.opcode.split(".")[1:]
    width = 4 if ("128" in mods or (base == "LDSM" and mods[-1:] == ["4"])) else (
        2 if ("64" in mods or "WIDE" in mods or (base == "LDSM" and mods[-1:] == ["2"])) else 1)
    return set(range(first, first + width))


def _read_registers(ins: Instruction) -> set[int]:
    """The general registers an instruction's source operands name (64-bit addresses
    ``R4.64`` as two)."""
    sources = ins.operands if not _written_registers(ins) else ins.operands[1:]
    regs: set[int] = set()
    for operand in sources:
        for match in re.finditer(r"\bR(\d+)(\.64)?", operand):
            first = int(match.group(1))
            regs |= {first, first + 1} if match.group(2) else {first}
    return regs


def load_leads(loop: list[Instruction], load: str = "LDG", counted: str = "HMMA") -> list[int]:
    """For each ``load`` of a loop body (instructions of one pass, the last the backward
    branch): how many ``counted`` instructions issue between it and the first
    instruction that reads a register it wrote (following the back edge): how far ahead
    of its use the load was issued."""
    leads = []
    for i, ins in enumerate(loop):
        if not ins.opcode.startswith(load):
            continue
        pending, seen = _written_registers(ins), 0
        for later in loop[i + 1:] + loop[:i + 1]:
            if _read_registers(later) & pending:
                break
            seen += later.opcode.startswith(counted)
            pending -= _written_registers(later)
            if not pending:
                break
        leads.append(seen)
    return leads


def _a_registers(ins: Instruction) -> set[int]:
    """An HGMMA's A operand registers (4: 8 bf16 values a thread), when A is in
    registers (else it is a shared-memory descriptor)."""
    match = _REGISTER.match(ins.operands[1]) if len(ins.operands) > 1 else None
    return set(range(int(match.group(1)), int(match.group(1)) + 4)) if match else set()


def inflight_clobbers(instructions: list[Instruction]) -> list[str]:
    """Instructions that write a register an issued, not yet retired HGMMA reads as its A
    operand. HGMMAs up to one marked ``gsb0`` form a group; ``WARPGROUP.DEPBAR.LE gsb0,
    N`` leaves the last N groups in flight. A backward branch with groups in flight
    re-scans its loop body once with them (the hazard across the back edge)."""
    found: list[str] = []
    index = {ins.address: i for i, ins in enumerate(instructions)}

    def scan(start: int, stop: int, closed: list[set[int]], rescan: bool) -> list[set[int]]:
        current: set[int] = set()
        for ins in instructions[start:stop]:
            base = ins.opcode.split(".")[0]
            pending = set().union(current, *closed)
            hit = _written_registers(ins) & pending
            if hit and base != "HGMMA":
                found.append(f"{ins.address:#06x} {ins.opcode} {', '.join(ins.operands)} "
                             f"writes R{min(hit)} of an HGMMA in flight")
            if base == "HGMMA":
                current |= _a_registers(ins)
                if "gsb0" in ins.operands:
                    closed, current = closed + [current], set()
            elif ins.opcode.startswith("WARPGROUP.DEPBAR"):
                keep = int(ins.operands[-1], 16)
                closed = closed[len(closed) - keep:] if keep else []
            elif base == "BRA" and rescan and closed:
                target = int(ins.operands[-1], 16)
                here = index[ins.address]
                if target in index and index[target] < here:
                    scan(index[target], here + 1, list(closed), rescan=False)
        return closed

    scan(0, len(instructions), [], rescan=True)
    return found
