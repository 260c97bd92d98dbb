"""Generated from notebooks/week5_model_and_pipeline_parallelism.ipynb — do not edit; edit the notebook and run `make export`."""


# -- cell 156
from dataclasses import dataclass

from dsml.validate_args import integer

NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "swiglu")
POSITIONS = ("learned", "rotary")


def _check_count(name: str, value) -> int:
    """`value` if it is an integer ≥ 1 (a size, a number of layers or ranks), else a ValueError."""
    return integer(name, value, 1)


def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")


def _check_config(config, sizes=None) -> None:
    """TransformerConfig's argument checks: a ValueError naming the field, value and rule.
    With `sizes` (field names), only that those are integers ≥ 1."""
    for field_name in sizes or ("layers", "hidden", "heads", "vocab", "seq_len", "kv_heads",
                                "ffn_hidden"):
        _check_count(field_name, getattr(config, field_name))
    if sizes:
        return
    if config.hidden % config.heads:
        raise ValueError(f"hidden must be divisible by heads: hidden={config.hidden}, "
                         f"heads={config.heads}")
    if config.heads % config.kv_heads:
        raise ValueError(f"heads must be divisible by kv_heads (each key/value head serves a "
                         f"whole group of query heads): heads={config.heads}, "
                         f"kv_heads={config.kv_heads}")
    _check_choice("norm", config.norm, NORMS)
    _check_choice("mlp", config.mlp, MLPS)
    _check_choice("positions", config.positions, POSITIONS)
    if config.positions == "rotary" and config.head_dim % 2:
        raise ValueError(f"rotary positions rotate pairs of coordinates: head_dim = "
                         f"hidden / heads must be even, got {config.head_dim}")


# -- cell 157
@dataclass(frozen=True)
class TransformerConfig:
    """The shapes of a decoder-only transformer, GPT-style or Llama-style.

    layers            l, transformer blocks
    hidden            h, model width
    heads             a, query heads; head_dim = h / a
    vocab             V, vocabulary size
    seq_len           s, maximum sequence length (rows of a learned position table)
    kv_heads          key/value heads (grouped-query attention when fewer than heads); default a
    ffn_hidden        f, width of the MLP; default 4h
    norm              "layernorm" (weight and bias) or "rmsnorm" (weight only)
    mlp               "gelu" (h×f then f×h) or "swiglu" (gate h×f, up h×f, down f×h)
    bias              a bias on every linear layer (the output head never has one, as in
                      GPT-2 and Llama)
    tied_embeddings   the output head reuses the token embedding matrix
    positions         "learned" (an s×h table) or "rotary" (no parameters)

    `breakdown()` and `num_params()` are exact counts derived from these shapes."""
    layers: int
    hidden: int
    heads: int
    vocab: int
    seq_len: int
    kv_heads: int | None = None
    ffn_hidden: int | None = None
    norm: str = "layernorm"
    mlp: str = "gelu"
    bias: bool = True
    tied_embeddings: bool = True
    positions: str = "learned"
    name: str = "custom"

    def __post_init__(self):
        _check_config(self, ("layers", "hidden", "heads", "vocab", "seq_len"))
        if self.kv_heads is None:  # frozen: defaults go through object.__setattr__
            object.__setattr__(self, "kv_heads", self.heads)
        if self.ffn_hidden is None:
            object.__setattr__(self, "ffn_hidden", 4 * self.hidden)
        _check_config(self)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        """Width of the key (and of the value) projection: kv_heads × head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def mlp_in_matrices(self) -> int:
        """h×f matrices at the MLP's input: 1 for GELU, 2 (gate and up) for SwiGLU."""
        return 2 if self.mlp == "swiglu" else 1

    @property
    def norm_params(self) -> int:
        """Parameters of one norm: weight and bias (LayerNorm) or weight only (RMSNorm)."""
        return 2 * self.hidden if self.norm == "layernorm" else self.hidden


# -- cell 158
from dsml.utils import add_to_class


@add_to_class(TransformerConfig)
@classmethod
def gpt_style(cls, layers: int, hidden: int, heads: int, vocab: int, seq_len: int,
              name: str = "custom") -> "TransformerConfig":
    """GPT-2's recipe: learned positions, LayerNorm, GELU MLP of width 4h, biases, tied head."""
    return cls(layers, hidden, heads, vocab, seq_len, name=name)


@add_to_class(TransformerConfig)
@classmethod
def llama_style(cls, layers: int, hidden: int, heads: int, vocab: int, seq_len: int,
                ffn_hidden: int, kv_heads: int | None = None,
                name: str = "custom") -> "TransformerConfig":
    """Llama's recipe: rotary positions, RMSNorm, SwiGLU MLP, no biases, untied head."""
    return cls(layers, hidden, heads, vocab, seq_len, kv_heads=kv_heads,
               ffn_hidden=ffn_hidden, norm="rmsnorm", mlp="swiglu", bias=False,
               tied_embeddings=False, positions="rotary", name=name)


# -- cell 159
@add_to_class(TransformerConfig)
def layer_breakdown(self) -> dict[str, int]:
    """Parameters of one transformer block: attention, mlp, norms (its two)."""
    h, kv, f = self.hidden, self.kv_dim, self.ffn_hidden
    attention = h * h + h * kv + h * kv + h * h          # W_q, W_k, W_v, W_o
    mlp = self.mlp_in_matrices * h * f + f * h            # input matrices, output matrix
    if self.bias:
        attention += h + kv + kv + h
        mlp += self.mlp_in_matrices * f + h
    return {"attention": attention, "mlp": mlp, "norms": 2 * self.norm_params}


@add_to_class(TransformerConfig)
def breakdown(self) -> dict[str, int]:
    """Exact parameter count by part: embeddings (tokens, learned positions), attention and
    mlp (all layers), norms (all layers plus the final norm), head (0 when tied)."""
    layer = self.layer_breakdown()
    embeddings = self.vocab * self.hidden
    if self.positions == "learned":
        embeddings += self.seq_len * self.hidden
    return {
        "embeddings": embeddings,
        "attention": self.layers * layer["attention"],
        "mlp": self.layers * layer["mlp"],
        "norms": self.layers * layer["norms"] + self.norm_params,
        "head": 0 if self.tied_embeddings else self.vocab * self.hidden,
    }


@add_to_class(TransformerConfig)
def num_params(self) -> int:
    """The exact number of parameters (the sum of `breakdown()`)."""
    return sum(self.breakdown().values())


# -- cell 160
def narayanan_params(config: TransformerConfig) -> float:
    """Narayanan et al. 2021 (eq. 2), an approximation for GPT-style models:
    P ≈ 12lh²(1 + 13/(12h) + (V + s)/(12lh))."""
    l, h, V, s = config.layers, config.hidden, config.vocab, config.seq_len
    return 12 * l * h**2 * (1 + 13 / (12 * h) + (V + s) / (12 * l * h))


# -- cell 162
PRESETS = {
    "gpt2": TransformerConfig.gpt_style(12, 768, 12, 50257, 1024, name="gpt2"),
    "gpt2-medium": TransformerConfig.gpt_style(24, 1024, 16, 50257, 1024, name="gpt2-medium"),
    "gpt2-large": TransformerConfig.gpt_style(36, 1280, 20, 50257, 1024, name="gpt2-large"),
    "gpt2-xl": TransformerConfig.gpt_style(48, 1600, 25, 50257, 1024, name="gpt2-xl"),
    "llama2-7b": TransformerConfig.llama_style(32, 4096, 32, 32000, 4096, ffn_hidden=11008,
                                               name="llama2-7b"),
    "llama2-13b": TransformerConfig.llama_style(40, 5120, 40, 32000, 4096, ffn_hidden=13824,
                                                name="llama2-13b"),
    "llama2-70b": TransformerConfig.llama_style(80, 8192, 64, 32000, 4096, ffn_hidden=28672,
                                                kv_heads=8, name="llama2-70b"),
}


def preset(name: str) -> TransformerConfig:
    """The configuration of a published model: one of PRESETS' names."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; valid names: {', '.join(PRESETS)}")
    return PRESETS[name]
