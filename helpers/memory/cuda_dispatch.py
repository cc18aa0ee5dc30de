"""How CUDA would run the ops whose memory differs from the CPU's (the planner, lesson 10).

The planner runs a script's ops on fake tensors that report the CPU, so by default they take
the CPU's kernels and keep what those kernels keep. Three kinds of op keep different memory
on a CUDA card, and :class:`~.planner._DeviceMode` sends them here when the run is fake:

* ``scaled_dot_product_attention`` (also inside ``nn.MultiheadAttention`` and
  ``nn.TransformerEncoderLayer``): :func:`sdpa_backend` picks the backend CUDA would, with
  the rules of PyTorch's ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``
  (``select_sdp_backend``: cuDNN first on sm90/sm100 only, then flash, memory-efficient,
  math; each backend's checks on dtype, mask, head size, causal shape and the card's compute
  capability) and the switches ``torch.backends.cuda.enable_*_sdp`` / ``sdpa_kernel`` set.
  :func:`run_sdpa` then calls that backend's own aten op on the fake tensors
  (``aten._scaled_dot_product_flash_attention`` and the rest have meta kernels and autograd
  formulas), so what is saved for backward is CUDA's: the output, the log-sum-exp and the
  RNG state, never the L x L matrix the CPU's math path keeps with dropout.
* Autocast: ``torch.autocast("cuda")`` runs as CPU autocast, whose op lists differ from
  CUDA's (``aten/src/ATen/autocast_mode.cpp``, and PyTorch's AMP docs "CUDA Op-Specific
  Behavior"). :func:`autocast_policy` says what CUDA does with an op; :func:`run_autocast`
  runs it so: inputs cast to float32 (``fp32``), output in float32 with no input copies
  (``fp32_out``: ``sum``/``softmax``..., CUDA's "fp32_set_opt_dtype"), inputs cast to the
  widest type (``promote``), to the low type (``lower``: ops CUDA casts down and the CPU
  does not, such as ``einsum``), or as they come (``as_is``: ops the CPU runs in float32 and
  CUDA does not).
* RNNs: ``nn.LSTM``/``GRU``/``RNN`` on CUDA run cuDNN's RNN, which keeps a *reserve space*
  for backward that the CPU's oneDNN path does not (its workspace counts 0 on fake tensors).
  cuDNN's exact size (``cudnnGetRNNTempSpaceSizes``) is only known on a GPU: the planner
  counts :func:`rnn_reserve_bytes`, a lower bound (what backward must keep per layer and
  step, as PyTorch's own fused CUDA cells keep it) and says so.

Each modelled call is recorded as a :class:`Dispatch` (what, where, which model, why) that
the plan lists. Runs with ``fake=False`` (real CPU tensors, the tests' reference) keep the
CPU's kernels.
"""

from __future__ import annotations

import dataclasses
import math

import torch

__all__ = ["Dispatch", "sdpa_backend", "prepare_mask", "run_sdpa", "autocast_policy",
           "run_autocast", "rnn_reserve_bytes", "CUDA_FP32_OPS", "CUDA_FP32_OUT_OPS",
           "CUDA_PROMOTE_OPS", "CUDA_ONLY_LOWER_OPS", "CPU_ONLY_FP32_OPS", "CPU_FP32_TOO",
           "SDPA_BACKENDS"]

_LOW = (torch.bfloat16, torch.float16)

#: ops CUDA autocast casts to float32 (inputs and output): PyTorch's AMP docs, "CUDA Ops
#: that can autocast to float32", by their Python names (``F.group_norm``, ``Tensor.exp``...)
CUDA_FP32_OPS = frozenset("""
__pow__ __rpow__ __rdiv__ __rtruediv__ acos asin cosh erfinv exp expm1 log log10 log2 log1p
reciprocal rsqrt sinh tan pow softplus layer_norm group_norm norm normalize cosine_similarity
poisson_nll_loss cosine_embedding_loss nll_loss hinge_embedding_loss kl_div l1_loss
smooth_l1_loss huber_loss mse_loss margin_ranking_loss multilabel_margin_loss soft_margin_loss
triplet_margin_loss multi_margin_loss binary_cross_entropy_with_logits dist pdist cdist renorm
logsumexp cross_entropy
""".split())

#: of those, the ops autocast_mode.cpp gives the ``fp32_set_opt_dtype`` policy: the kernel
#: reads the low-precision input and writes a float32 output (no input copy)
CUDA_FP32_OUT_OPS = frozenset("prod cumprod cumsum sum softmax log_softmax softmin".split())

#: CUDA's "promote" list: run in the widest input type (autocast_mode.cpp KERNEL_CUDA promote)
CUDA_PROMOTE_OPS = frozenset("""
addcdiv addcmul atan2 bilinear cross dot grid_sample index_put index_put_ scatter_add
scatter_add_ tensordot
""".split())

#: ops CUDA autocast casts to the low type that CPU autocast leaves alone
CUDA_ONLY_LOWER_OPS = frozenset("""
addmv addr einsum mv chain_matmul multi_dot lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell
""".split())

#: ops CPU autocast runs in float32 that CUDA autocast runs in their input type (CPU's fp32
#: list in autocast_mode.cpp minus CUDA's lists)
CPU_ONLY_FP32_OPS = frozenset("""
avg_pool3d max_pool3d adaptive_avg_pool3d adaptive_max_pool3d max_unpool2d max_unpool3d
polar quantile nanquantile stft trace
""".split())

#: ops of CUDA's float32 lists that CPU autocast runs in float32 too (its fp32 list in
#: autocast_mode.cpp; checked on this torch: a bfloat16 input gives a float32 output), so
#: nothing differs: the losses, ``cdist`` and ``prod``
CPU_FP32_TOO = frozenset("""
mse_loss l1_loss smooth_l1_loss huber_loss cross_entropy nll_loss kl_div
binary_cross_entropy_with_logits soft_margin_loss multi_margin_loss multilabel_margin_loss
hinge_embedding_loss poisson_nll_loss margin_ranking_loss cosine_embedding_loss
triplet_margin_loss cdist prod
""".split())

#: the SDPA backends in the order CUDA tries them (sdp_utils.cpp select_sdp_backend)
SDPA_BACKENDS = {
    "cudnn": "cuDNN attention",
    "flash": "flash attention",
    "efficient": "memory-efficient attention",
    "math": "math path",
}


@dataclasses.dataclass
class Dispatch:
    """One op the plan ran as CUDA would, where the CPU's kernel keeps different memory."""

    op: str  # the script's call: "scaled_dot_product_attention", "group_norm", "lstm"
    where: object  # the planner's CodeLine (the script's line) or None
    model: str  # the model used: "flash attention", "float32 (CUDA autocast)"...
    detail: str  # why, in words: dtype, head size, the card; what the CPU would do
    count: int = 1
    extra_bytes: int = 0  # bytes this model adds over the CPU's (negative: saves), if known

    def text(self) -> str:
        where = f" at {self.where}" if self.where else ""
        return f"{self.op}{where}: {self.model} ({self.detail}), {self.count}x"


# ---------------------------------------------------------------------------------- SDPA
def _sdp_switches() -> dict:
    """What ``torch.backends.cuda.enable_*_sdp`` and ``sdpa_kernel`` have set (they set the
    same global context on a CPU build)."""
    c = torch._C
    return {"cudnn": c._get_cudnn_sdp_enabled(), "flash": c._get_flash_sdp_enabled(),
            "efficient": c._get_mem_efficient_sdp_enabled(), "math": c._get_math_sdp_enabled()}


def _priority(cc: tuple[int, int]) -> list[str]:
    """sdp_utils.cpp priority_order: cuDNN attention first on sm90 and sm100 (cuDNN >= 9.9,
    which PyPI's CUDA builds of this torch ship), otherwise the context's order (flash,
    efficient, math, cuDNN), unless ``sdpa_kernel(..., set_priority=True)`` set one."""
    order = None
    try:
        names = {int(b): b.name for b in torch._C._SDPBackend.__members__.values()}
        order = [names.get(int(i), "") for i in torch._C._get_sdp_priority_order()]
        order = [{"flash_attention": "flash", "efficient_attention": "efficient",
                  "cudnn_attention": "cudnn", "math": "math"}.get(n, "") for n in order]
        order = [n for n in order if n]
    except (AttributeError, RuntimeError, TypeError, ValueError):
        order = None
    default = ["flash", "efficient", "math", "cudnn"]
    if not order:
        order = default
    if order == default and cc[0] in (9, 10) and cc[1] == 0:
        order = ["cudnn", "flash", "efficient", "math"]
    return order


def _sm_in(cc, lo, hi) -> bool:
    return lo <= cc <= hi


def sdpa_backend(query, key, value, *, attn_mask=None, dropout_p: float = 0.0,
                 is_causal: bool = False, enable_gqa: bool = False,
                 cc: tuple[int, int] = (8, 0), requires_grad: bool | None = None,
                 switches: dict | None = None, deterministic: bool | None = None
                 ) -> tuple[str, str]:
    """The backend CUDA's ``scaled_dot_product_attention`` picks for these (dense) inputs on
    a card of compute capability ``cc``, and why the ones before it were not taken.

    The checks are sdp_utils.cpp's (``can_use_cudnn_attention``, ``can_use_flash_attention``,
    ``can_use_mem_efficient_attention``) for dense tensors. Returns ``(backend, reasons)``:
    a key of :data:`SDPA_BACKENDS` (``"error"`` when every backend is switched off or
    refuses) and a short text.
    """
    switches = _sdp_switches() if switches is None else switches
    if requires_grad is None:
        requires_grad = torch.is_grad_enabled() and any(
            t.requires_grad for t in (query, key, value))
    if deterministic is None:
        deterministic = (torch.are_deterministic_algorithms_enabled()
                         and not torch.is_deterministic_algorithms_warn_only_enabled())
    dtype = query.dtype
    dims4 = query.dim() == 4 and key.dim() == 4 and value.dim() == 4
    hd_q, hd_k, hd_v = query.shape[-1], key.shape[-1], value.shape[-1]
    same_dtype = query.dtype == key.dtype == value.dtype
    stride1 = all(t.stride(-1) == 1 for t in (query, key, value))
    nonzero = all(s > 0 for t in (query, key, value) for s in t.shape)
    same_heads = dims4 and query.shape[:2] == key.shape[:2] == value.shape[:2]
    gqa_ok = dims4 and (same_heads or (enable_gqa and query.shape[0] == key.shape[0]
                                       and query.shape[1] % key.shape[1] == 0))
    why: dict[str, str] = {}

    def shapes() -> str:
        if not dims4:
            return "needs 4-D (batch, heads, length, head) inputs"
        if not same_dtype:
            return "needs q, k and v of one dtype"
        if not nonzero:
            return "needs non-empty inputs"
        return ""

    def cudnn() -> str:
        if not switches.get("cudnn", True):
            return "switched off"
        if (s := shapes()):
            return s
        if deterministic:
            return "not deterministic (use_deterministic_algorithms is on)"
        if dtype not in _LOW:
            return f"needs float16/bfloat16, got {_dt(dtype)}"
        if not _sm_in(cc, (8, 0), (12, 1)):
            return f"needs sm80-sm121, the card is sm{cc[0]}{cc[1]}"
        if not stride1:
            return "needs the head dimension contiguous"
        if not gqa_ok:
            return "needs matching batch and heads"
        limit = 256 if cc == (9, 0) else 128
        if hd_q > limit or hd_v > limit or hd_q % 8 or hd_v % 8:
            return f"needs a head size that is a multiple of 8 up to {limit}, got {hd_q}"
        if key.shape[-2] == 1:
            return "needs a key length above 1"
        if query.shape[-2] == 1 and dropout_p > 0:
            return "no dropout with a query length of 1"
        return ""

    def flash() -> str:
        if not switches.get("flash", True):
            return "switched off"
        if (s := shapes()):
            return s
        if attn_mask is not None:
            return "takes no attn_mask"
        if not (hd_q == hd_k == hd_v and hd_q <= 256):
            return f"needs one head size up to 256, got {hd_q}/{hd_k}/{hd_v}"
        if not _sm_in(cc, (8, 0), (12, 1)):
            return f"needs sm80-sm121, the card is sm{cc[0]}{cc[1]}"
        if requires_grad and (_sm_in(cc, (8, 6), (8, 9)) or _sm_in(cc, (12, 0), (12, 1))) \
                and ((192 < hd_q <= 224) or (hd_q > 224 and dropout_p > 0)):
            return f"no training with head size {hd_q} on sm{cc[0]}{cc[1]}"
        if is_causal and query.shape[-2] != key.shape[-2]:
            return "is_causal needs equal query and key lengths"
        if dtype not in _LOW:
            return f"needs float16/bfloat16, got {_dt(dtype)}"
        if not gqa_ok:
            return "needs matching batch and heads"
        if not stride1:
            return "needs the head dimension contiguous"
        return ""

    def efficient() -> str:
        if not switches.get("efficient", True):
            return "switched off"
        if not _sm_in(cc, (5, 0), (12, 1)):
            return f"needs sm50-sm121, the card is sm{cc[0]}{cc[1]}"
        if (s := shapes()):
            return s
        half = dtype in _LOW
        if cc[0] >= 8:
            align = max(4, 128 // (16 if half else 32))
        elif cc[0] >= 7:
            align = 8 if half else 1
        else:
            align = 1
        if hd_q != hd_k or hd_q % align or hd_v % align:
            return f"needs head sizes that are multiples of {align}, got {hd_q}/{hd_v}"
        if not same_heads:
            return "needs matching batch and heads (no grouped-query attention)"
        if not stride1:
            return "needs the head dimension contiguous"
        ok = (torch.float16, torch.float32, torch.bfloat16) if cc[0] >= 8 else \
            (torch.float16, torch.float32)
        if dtype not in ok:
            return f"cannot take {_dt(dtype)} on sm{cc[0]}{cc[1]}"
        return ""

    checks = {"cudnn": cudnn, "flash": flash, "efficient": efficient,
              "math": lambda: "" if switches.get("math", True) else "switched off"}
    for name in _priority(cc):
        reason = checks[name]()
        if not reason:
            skipped = "; ".join(f"{SDPA_BACKENDS[n]}: {r}" for n, r in why.items()
                                if r != "switched off" or not switches.get(n, True))
            return name, skipped
        why[name] = reason
    return "error", "; ".join(f"{SDPA_BACKENDS[n]}: {r}" for n, r in why.items())


def _dt(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _repeat_kv(query, key, value):
    """Grouped-query attention for the math path: k and v repeated to q's heads (as
    attention.cpp's math path does with enable_gqa)."""
    if key.dim() == 4 and key.shape[1] != query.shape[1]:
        rep = query.shape[1] // key.shape[1]
        key = key.repeat_interleave(rep, dim=1)
        value = value.repeat_interleave(rep, dim=1)
    return key, value


def prepare_mask(backend: str, query, key, attn_mask):
    """The mask as attention.cpp hands it to the fused kernels: a boolean mask becomes an
    additive one of the query's type (``convert_boolean_attn_mask``), expanded to
    (batch, heads, L, S)."""
    if backend not in ("efficient", "cudnn") or attn_mask is None:
        return attn_mask
    if attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros_like(attn_mask, dtype=query.dtype).masked_fill(
            attn_mask.logical_not(), float("-inf"))
    return attn_mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])


def run_sdpa(backend: str, query, key, value, attn_mask=None, dropout_p=0.0,
             is_causal=False, scale=None, enable_gqa=False):
    """Run ``scaled_dot_product_attention`` with ``backend``'s aten op (attention.cpp's
    ``scaled_dot_product_attention`` for CUDA). Returns the op's device outputs: ``(out,
    logsumexp)`` for a fused backend, ``(out, attention weights)`` for the math path.

    The ops' meta kernels give CUDA's outputs and their autograd nodes save what CUDA's
    save. The fused kernels' RNG seed and offset are host tensors on CUDA (attention.cu
    makes them with ``at::scalar_tensor`` outside graph capture): they are not returned
    here, and the caller leaves them uncounted. ``attn_mask`` comes from
    :func:`prepare_mask`.
    """
    aten = torch.ops.aten
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    if backend == "flash":
        return aten._scaled_dot_product_flash_attention(
            query, key, value, dropout_p, is_causal, False, scale=scale)[:2]
    if backend == "cudnn":
        return aten._scaled_dot_product_cudnn_attention(
            query, key, value, attn_mask, grad, dropout_p, is_causal, False, scale=scale)[:2]
    if backend == "efficient":
        return aten._scaled_dot_product_efficient_attention(
            query, key, value, attn_mask, grad, dropout_p, is_causal, scale=scale)[:2]
    if enable_gqa:
        key, value = _repeat_kv(query, key, value)
    return aten._scaled_dot_product_attention_math(
        query, key, value, attn_mask, dropout_p, is_causal, scale=scale)


def sdpa_args(args, kwargs) -> dict:
    """``F.scaled_dot_product_attention``'s arguments by name."""
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
             "enable_gqa")
    out = dict(zip(names, args, strict=False))
    out.update(kwargs)
    out.setdefault("attn_mask", None)
    out.setdefault("dropout_p", 0.0)
    out.setdefault("is_causal", False)
    out.setdefault("scale", None)
    out.setdefault("enable_gqa", False)
    return out


def cpu_sdpa_backend(a: dict) -> str:
    """What the CPU would run (sdp_utils_cpp.cpp: flash unless dropout, a 4-D shape, one
    head size or a mask shape rules it out; then math)."""
    q, k, v = a["query"], a["key"], a["value"]
    if a["dropout_p"] > 0 and torch.is_grad_enabled():
        return "math"
    if q.dim() != 4 or not (q.shape[-1] == k.shape[-1] == v.shape[-1]):
        return "math"
    return "flash"


# ---------------------------------------------------------------------------------- autocast
def autocast_policy(name: str) -> str | None:
    """What CUDA autocast does with the op named ``name`` where CPU autocast does otherwise:
    ``"fp32"``, ``"fp32_out"``, ``"promote"``, ``"lower"``, ``"as_is"`` or None (the same)."""
    if name in CPU_FP32_TOO:
        return None
    if name in CUDA_FP32_OUT_OPS:
        return "fp32_out"
    if name in CUDA_FP32_OPS:
        return "fp32"
    if name in CUDA_PROMOTE_OPS:
        return "promote"
    if name in CUDA_ONLY_LOWER_OPS:
        return "lower"
    if name in CPU_ONLY_FP32_OPS:
        return "as_is"
    return None


def _map_tensors(fn, obj):
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_tensors(fn, o) for o in obj)
    if isinstance(obj, dict):
        return {k: _map_tensors(fn, v) for k, v in obj.items()}
    return obj


def _floats(obj) -> list:
    out: list = []
    _map_tensors(lambda t: out.append(t) if t.is_floating_point() else None, obj)
    return out


def run_autocast(policy: str, func, args, kwargs, low_dtype):
    """Run ``func`` as CUDA autocast would under ``policy`` (CPU autocast off meanwhile).
    Returns ``(output, bytes of the input copies made, whether CUDA differs from the CPU
    here)``: an op whose inputs are already in CUDA's type runs the same on both."""
    copies = [0]
    floats = _floats((args, kwargs))
    if policy in ("fp32_out", "as_is"):
        differs = any(t.dtype in _LOW for t in floats)
    else:
        differs = None  # decided by the casts below

    def cast(dtype):
        def f(t):
            if t.is_floating_point() and t.dtype != dtype and t.dtype != torch.float64:
                out = t.to(dtype)
                copies[0] += out.numel() * out.element_size()
                return out
            return t
        return f

    if policy == "fp32":
        args, kwargs = _map_tensors(cast(torch.float32), (args, kwargs))
    elif policy == "lower":
        args, kwargs = _map_tensors(cast(low_dtype), (args, kwargs))
    elif policy == "promote":
        if floats:
            widest = floats[0].dtype
            for t in floats[1:]:
                widest = torch.promote_types(widest, t.dtype)
            args, kwargs = _map_tensors(cast(widest), (args, kwargs))
    with torch.autocast("cpu", enabled=False):
        if policy == "fp32_out" and "dtype" not in kwargs and _floats(args[:1]) and \
                args[0].dtype in _LOW:
            try:
                return func(*args, dtype=torch.float32, **kwargs), 0, True
            except TypeError:  # an overload without dtype: as CUDA, cast the input
                args = _map_tensors(cast(torch.float32), args)
        out = func(*args, **kwargs)
    return out, copies[0], bool(copies[0]) if differs is None else differs


# ---------------------------------------------------------------------------------- RNNs
#: per layer, direction and step, the values of hidden size backward needs (PyTorch's fused
#: CUDA cells: _thnn_fused_lstm_cell keeps a (batch, 4*hidden) workspace and the cell state;
#: _thnn_fused_gru_cell a (batch, 5*hidden) workspace; a plain RNN its activations)
RNN_KEPT_PER_STEP = {"lstm": 5, "gru": 5, "rnn_tanh": 1, "rnn_relu": 1}


def rnn_reserve_bytes(mode: str, *, steps: int, batch: int, hidden: int, layers: int,
                      directions: int, itemsize: int) -> int:
    """A lower bound of cuDNN's RNN reserve space in training: what backward must keep for
    every layer, direction and time step (:data:`RNN_KEPT_PER_STEP` hidden-sized values per
    batch row). cuDNN's exact size (``cudnnGetRNNTempSpaceSizes``) is known only on a GPU."""
    per = RNN_KEPT_PER_STEP[mode]
    return math.prod((per, hidden, steps, batch, layers, directions, itemsize))
