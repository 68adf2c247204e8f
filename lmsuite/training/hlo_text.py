"""A reader of XLA's optimised HLO text (`compiled.as_text()`): computations, instructions,
shapes with their TPU layouts and memory spaces. What `roofline.py` needs, nothing more.

One instruction per line:

  %fusion.7 = bf16[8,128,768]{2,1,0:T(8,128)(2,1)} fusion(%p.1, %p.2), kind=kLoop, calls=%f.7

  >>> module = parse(compiled.as_text())
  >>> [i.opcode for i in module.entry.instructions][:3]
  ['parameter', 'parameter', 'fusion']
"""

import dataclasses
import math
import re

_DTYPE_BYTES = {
    "pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "s32": 4, "u32": 4,
    "s64": 8, "u64": 8, "f8e4m3fn": 1, "f8e5m2": 1, "bf16": 2, "f16": 2, "f32": 4, "f64": 8,
    "c64": 8, "c128": 16, "token": 0,
}  # fmt: skip

# `f32[8,128]{1,0:T(8,128)S(1)}`: dtype, dims, then an optional layout: minor-to-major order,
# tiles, memory space.
_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([\d,]*)\](?:\{([^{}]*)\})?")
_HEADER = re.compile(r"^(ENTRY )?%([\w.\-]+) \(.*\) -> .* \{$")
_INSTRUCTION = re.compile(r"^\s*(ROOT )?%([\w.\-]+) = (.*)$")
_OPERAND = re.compile(r"%([\w.\-]+)")


@dataclasses.dataclass(frozen=True)
class Array:
    """One array of a shape: its dtype, dims, and where the layout puts it."""

    dtype: str
    dims: tuple[int, ...]
    minor_to_major: tuple[int, ...] | None
    tile: tuple[int, ...] | None  # the first (outermost) tile, e.g. (8, 128)
    memory_space: int  # 0: HBM; other spaces are on-chip (VMEM, SMEM, ...) on TPU

    @property
    def elements(self) -> int:
        return math.prod(self.dims)

    @property
    def padded_elements(self) -> int:
        """Elements as stored: the minor dims rounded up to the layout's tile (a (16,) minor dim
        in an (8, 128) tile takes 128 lanes)."""
        if not self.tile or not self.dims:
            return self.elements
        order = self.minor_to_major or tuple(reversed(range(len(self.dims))))
        physical = [self.dims[d] for d in reversed(order)]  # major ... minor
        physical = [1] * max(0, len(self.tile) - len(physical)) + physical
        for j, t in enumerate(self.tile, start=len(physical) - len(self.tile)):
            physical[j] = -(-physical[j] // t) * t
        return math.prod(physical)

    @property
    def bytes(self) -> float:
        return self.padded_elements * _DTYPE_BYTES.get(self.dtype, 4)


def parse_shape(text: str) -> tuple[Array, ...]:
    """Every array of a shape string, a tuple's in order: `(f32[2], s32[])` -> two arrays."""
    arrays = []
    for dtype, dims, layout in _ARRAY.findall(text):
        if dtype not in _DTYPE_BYTES:
            continue
        minor_to_major = tile = None
        space = 0
        if layout:
            order, _, rest = layout.partition(":")
            if order.strip():
                minor_to_major = tuple(int(d) for d in order.split(","))
            found = re.search(r"T\(([\d,]+)\)", rest)
            if found:
                tile = tuple(int(t) for t in found[1].split(","))
            found = re.search(r"S\((\d+)\)", rest)
            if found:
                space = int(found[1])
        shape = tuple(int(d) for d in dims.split(",")) if dims else ()
        arrays.append(Array(dtype, shape, minor_to_major, tile, space))
    return tuple(arrays)


@dataclasses.dataclass
class Instruction:
    name: str
    opcode: str
    shape: tuple[Array, ...]  # the result (a tuple's arrays in order)
    operands: tuple[str, ...]
    attributes: str  # everything after the operand list
    is_root: bool
    operand_text: str = ""  # the raw text between the parentheses

    @property
    def parameter_number(self) -> int | None:
        return int(self.operand_text) if self.opcode == "parameter" else None

    def attribute(self, key: str) -> str | None:
        """The raw value of `key=...` (a computation name, a {...} group, a quoted string)."""
        found = re.search(rf"(?:^|[ ,]){re.escape(key)}=", self.attributes)
        if found is None:
            return None
        rest = self.attributes[found.end() :]
        if rest.startswith(("{", '"')):
            close = "}" if rest[0] == "{" else '"'
            depth = 0
            for i, c in enumerate(rest):
                if rest[0] == "{":
                    depth += c == "{"
                    depth -= c == "}"
                    if depth == 0:
                        return rest[1:i]
                elif i and c == close:
                    return rest[1:i]
            return rest
        return re.match(r"[^,\s]*", rest)[0]

    @property
    def op_name(self) -> str:
        found = re.search(r'op_name="([^"]*)"', self.attributes)
        return found[1] if found else ""

    def called(self) -> list[str]:
        """Computations this instruction runs (fusion bodies, loop bodies, branches), not the
        scalar reducers of `to_apply`."""
        names = []
        for key in ("calls", "body", "condition", "true_computation", "false_computation"):
            value = self.attribute(key)
            if value:
                names += [v.strip().lstrip("%") for v in value.split(",")]
        branches = self.attribute("branch_computations")
        if branches:
            names += [v.strip().lstrip("%") for v in branches.split(",")]
        return names


@dataclasses.dataclass
class Computation:
    name: str
    instructions: list[Instruction]
    is_entry: bool

    def __post_init__(self):
        self.by_name = {i.name: i for i in self.instructions}

    @property
    def root(self) -> Instruction:
        return next(i for i in self.instructions if i.is_root)


@dataclasses.dataclass
class Module:
    computations: dict[str, Computation]

    @property
    def entry(self) -> Computation:
        return next(c for c in self.computations.values() if c.is_entry)


def _split_call(text: str) -> tuple[str, str, str, str]:
    """`bf16[2]{0} add(%a, %b), k=v` -> (shape text, opcode, operand text, attributes)."""
    depth, cut = 0, len(text)
    for i, c in enumerate(text):  # the shape ends at the first space outside (...) and {...}
        depth += c in "({["
        depth -= c in ")}]"
        if c == " " and depth == 0:
            cut = i
            break
    shape, rest = text[:cut], text[cut + 1 :]
    opcode, _, rest = rest.partition("(")
    depth, end = 1, len(rest)
    for j, c in enumerate(rest):
        depth += c == "("
        depth -= c == ")"
        if depth == 0:
            end = j
            break
    return shape, opcode.strip(), rest[:end], rest[end + 1 :].lstrip(", ")


def parse(text: str) -> Module:
    """The computations of an HLO module's text, by name."""
    computations: dict[str, Computation] = {}
    current: tuple[str, bool, list[Instruction]] | None = None
    for line in text.splitlines():
        if current is None:
            header = _HEADER.match(line)
            if header:
                current = (header[2], bool(header[1]), [])
            continue
        if line.strip() == "}":
            name, is_entry, instructions = current
            computations[name] = Computation(name, instructions, is_entry)
            current = None
            continue
        found = _INSTRUCTION.match(line)
        if found is None:
            continue
        shape, opcode, operands, attributes = _split_call(found[3])
        current[2].append(
            Instruction(
                name=found[2],
                opcode=opcode,
                shape=parse_shape(shape),
                operands=tuple(_OPERAND.findall(operands)),
                attributes=attributes,
                is_root=bool(found[1]),
                operand_text=operands.strip(),
            )
        )
    if not any(c.is_entry for c in computations.values()):
        raise ValueError("no ENTRY computation in the HLO text; expected compiled.as_text()")
    return Module(computations)


def trip_count(module: Module, computation: Computation, inst: Instruction) -> int:
    """The loop's trips: XLA's `known_trip_count` when it recorded one, else read from the loop
    (a counter from a constant, compared LT/GT with a constant, stepped by a constant).

    Raises:
      ValueError: a loop whose trip count neither XLA nor this reading knows.
    """
    found = re.search(r'"known_trip_count":\{"n":"(\d+)"', inst.attributes)
    if found is not None:
        return int(found[1])
    condition = module.computations[inst.attribute("condition").lstrip("%")]
    body = module.computations[inst.attribute("body").lstrip("%")]
    compare = condition.root
    direction = compare.attribute("direction")
    counter = condition.by_name.get(compare.operands[0]) if compare.operands else None
    if (
        compare.opcode == "compare"
        and counter is not None
        and counter.opcode == "get-tuple-element"
    ):
        index = int(counter.attribute("index"))
        limit = _constant(condition, compare.operands[1])
        init = _constant(computation, _tuple_element(computation, inst.operands[0], index))
        update = body.by_name.get(_tuple_element(body, body.root.name, index))
        step = None
        if update is not None and update.opcode == "add":
            step = next((_constant(body, o) for o in update.operands if _constant(body, o)), None)
        if None not in (limit, init, step) and step > 0 and direction in ("LT", "LE"):
            return max(0, -(-(limit - init + (direction == "LE")) // step))
    raise ValueError(
        f"while loop {inst.name}: its trip count is neither recorded by XLA nor readable from "
        "the loop (a counter compared with a constant); the per-op projection needs it"
    )


def _tuple_element(computation: Computation, name: str, index: int) -> str | None:
    tuple_ = computation.by_name.get(name)
    if tuple_ is None or tuple_.opcode != "tuple" or index >= len(tuple_.operands):
        return None
    return tuple_.operands[index]


def _constant(computation: Computation, name: str | None) -> int | None:
    """The integer a scalar constant holds, through copies, converts and bitcasts."""
    inst = computation.by_name.get(name) if name else None
    while inst is not None and inst.opcode in ("copy", "convert", "bitcast") and inst.operands:
        inst = computation.by_name.get(inst.operands[0])
    if inst is None or inst.opcode != "constant":
        return None
    try:
        return int(inst.operand_text)
    except ValueError:
        return None
