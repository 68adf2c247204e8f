"""Parameter counts, shapes and logical axes of a ModelConfig, from abstract shapes only."""

import json

import flax.linen as nn
import jax
import numpy as np
from flax import traverse_util

from lmsuite.models import families
from lmsuite.models.config import ModelConfig

# Lookup tables count as "embedding" parameters (Kaplan et al. 2020): tokens, types, positions.
_EMBEDDING_TABLES = ("token_embedder/", "type_embedder/", "position_embedder/")


def abstract_variables(config: ModelConfig, *, length: int = 8):
    """`Transformer(config).init` evaluated on shapes: boxed params, nothing allocated."""
    model = families.Transformer(config)
    inputs = families.example_inputs(config, length=length)
    return jax.eval_shape(lambda rng: model.init(rng, **inputs), jax.random.PRNGKey(0))


def summarize(config: ModelConfig) -> dict:
    """Counts (total, embedding, non-embedding, per top-level module) and per-parameter rows."""
    boxed = abstract_variables(config)["params"]
    flat = traverse_util.flatten_dict(
        boxed, sep="/", is_leaf=lambda _, x: isinstance(x, nn.Partitioned)
    )
    rows = []
    per_module: dict[str, int] = {}
    embedding = 0
    for path, leaf in sorted(flat.items()):
        names = tuple(leaf.names) if isinstance(leaf, nn.Partitioned) else None
        value = nn.unbox(leaf)
        size = int(np.prod(value.shape))
        rows.append({"path": path, "shape": list(value.shape), "axes": names, "count": size})
        top = path.split("/")[0]
        per_module[top] = per_module.get(top, 0) + size
        if any(t in path + "/" for t in _EMBEDDING_TABLES):
            embedding += size
    total = sum(r["count"] for r in rows)
    return {
        "total": total,
        "embedding": embedding,
        "non_embedding": total - embedding,
        "per_module": per_module,
        "params": rows,
    }


def format_summary(summary: dict, *, title: str = "") -> str:
    """A human-readable table of `summarize`'s result."""
    lines = [title] if title else []
    lines.append(
        f"total {summary['total']:,}  embedding {summary['embedding']:,}  "
        f"non-embedding {summary['non_embedding']:,}"
    )
    lines.append("")
    lines.append("per top-level module:")
    for name, count in summary["per_module"].items():
        lines.append(f"  {name:<24} {count:>14,}")
    lines.append("")
    width = max(len(r["path"]) for r in summary["params"])
    lines.append(f"{'parameter':<{width}}  {'shape':<20} {'logical axes':<28} {'count':>12}")
    for r in summary["params"]:
        shape = "(" + ", ".join(map(str, r["shape"])) + ")"
        axes = "(" + ", ".join(str(a) for a in r["axes"]) + ")" if r["axes"] else "-"
        lines.append(f"{r['path']:<{width}}  {shape:<20} {axes:<28} {r['count']:>12,}")
    return "\n".join(lines)


def summary_json(summary: dict) -> str:
    return json.dumps(summary, indent=2)
