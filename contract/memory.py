"""How much memory one training process of a job needs at its peak, estimated from the spec
and the base model's shape before anything is loaded (issues 14, 25; DESIGN.md §5-6). The
micro-batch that fits a given memory is chosen from it in contract.micro_batch.

Torch-free (the API imports it). Per process: host RAM on a CPU, device memory on a GPU (FSDP
divides weights, gradients and AdamW state by the processes). Parts (`MemoryEstimate.parts`):

* `runtime`: the process (CPU: Python, torch, transformers ~0.5 GiB RSS; GPU: the CUDA context).
* `weights`: full fine-tuning keeps fp32 master weights plus, under bf16/fp16 autocast, the
  cast copy each op keeps for backward; LoRA stores the base in `precision`, the adapter fp32.
* `gradients and optimizer`: fp32 gradients and AdamW's two moments of what trains (12 B each).
* `reference`: a full fine-tune's frozen copy when the reference never moves; a moving one
  keeps k × grad_accum micro-batches of fp32 log-probs (trainer.reference).
* `activations`: what autograd keeps for one micro-batch (`layer_bytes` per token and layer;
  with checkpointing each layer's input and one layer recomputed).
* `logits`: the log-probs' head: one chunk of fp32 logits and its backward (trainer.
  chunked_logps), or the old path's full [rows, C, V] logits (`chunked_logps=False`).
* `sampler`: online jobs: HF generate's KV cache between steps, or vLLM's weights and cache.
* `training data`: the memory-mapped token ids and 80 bytes of offsets a record.

Every row is assumed `max_length` long (batches pad to their longest). The peak is the static
parts plus the larger of a step (activations + logits) and a sampling round. Calibration: GPU
peaks in contract/memory_calibration.json (tests/contract/test_memory.py holds each to
[0.8, 1.25]) and CPU peaks (tests/trainer/test_memory_estimate.py, benchmarks/memory_scale.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from contract.shapes import BUILTIN_SHAPES as BUILTIN_SHAPES  # re-exported: callers' names
from contract.shapes import SMOLLM2 as SMOLLM2
from contract.shapes import SMOLLM2_PUBLIC as SMOLLM2_PUBLIC
from contract.shapes import TINY_LLAMA as TINY_LLAMA
from contract.shapes import ModelShape
from contract.spec import JobSpec

GiB = 1 << 30
RUNTIME_BYTES = int(0.5 * GiB)  # a CPU process: Python, torch, transformers (RSS 0.45-0.46 GiB
# measured before training in tests/trainer/test_memory_estimate.py; 0.6 read 1.24-1.25 of peaks)
# A GPU process's device memory outside torch's tensors: the CUDA context with its kernels
# (~0.5 GiB on an H100/H200, torch 2.x, lazy module loading) and cuBLAS/cuDNN workspaces.
# The allocator's cached-but-free blocks are the safety margin's (contract.micro_batch).
RUNTIME_BYTES_ON = {"cpu": RUNTIME_BYTES, "cuda": 1 * GiB}
# trainer.chunked_logps' budget: one chunk's fp32 logits (tokens = this ÷ 4V, at least
# LOGPS_MIN_CHUNK). The trainer uses the same number; a test checks they agree.
LOGPS_CHUNK_BYTES = 256 << 20
LOGPS_MIN_CHUNK = 64
# Without activation checkpointing the head keeps each kept token's fp32 softmax for backward
# instead of projecting the token again (trainer.chunked_logps, keep_softmax) when those 4·V
# bytes are at most this share of what the decoder layers keep for that token anyway: the
# recompute's extra head matmul then buys little memory (SmolLM2: 0.2 MB beside 1.4 MB) and
# costs the step time (issue 25's CPU target). A vocabulary-dominated shape (4·V several times
# the layers' saves) recomputes, as does every checkpointed step (memory was asked for).
SOFTMAX_KEEP_SHARE = 0.25
SAMPLER_ROWS = 64  # rows decoded together: trainer.sampling.hf_engine.HFSampler's default
DATA_BYTES_PER_FILE_BYTE = 1.0
DATA_BYTES_PER_RECORD = 80  # a record's offsets: 32 bytes per sequence, 8 per example
PRECISION_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
ENGINE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per part (see the module docstring), the spec fields that drive each, and the
    peak: the static parts plus the larger of a training step and a sampling round."""

    parts: dict[str, int]
    fields: dict[str, tuple[str, ...]] = field(default_factory=dict)
    step: tuple[str, ...] = ("activations", "logits")
    transient: tuple[str, ...] = ("sampler",)  # between steps, not during one

    @property
    def total(self) -> int:
        static = sum(
            v for k, v in self.parts.items() if k not in self.step and k not in self.transient
        )
        step = sum(self.parts.get(k, 0) for k in self.step)
        between = sum(self.parts.get(k, 0) for k in self.transient)
        return static + max(step, between)

    @property
    def gib(self) -> float:
        return self.total / GiB

    def largest(self) -> list[tuple[str, int]]:
        """The parts a job can change (not the runtime), largest first."""
        parts = ((k, v) for k, v in self.parts.items() if k != "runtime" and v > 0)
        return sorted(parts, key=lambda kv: -kv[1])

    def drivers(self) -> list[str]:
        """The spec fields behind the largest parts, in that order, each once."""
        out: list[str] = []
        for part, _ in self.largest():
            for name in self.fields.get(part, ()):
                if name not in out:
                    out.append(name)
        return out


def layer_bytes(shape: ModelShape, spec: JobSpec, key_len: int) -> int:
    """Bytes autograd keeps per token for one decoder layer's backward (transformers' Llama
    layer, SDPA attention; counted with saved_tensors_hooks on CPU, fp32 and bf16 autocast,
    full and LoRA: the formula matched each count exactly). What a layer keeps, and why:

    * each RMSNorm keeps its input in fp32 (4 H: the stream itself, or the fp32 copy it makes
      of a bf16 stream); a trainable norm weight (full fine-tuning) also keeps x·rsqrt (4 H).
    * a projection keeps its input only when its weight or a LoRA adapter on it trains (autograd
      saves what the gradients it will compute need). Under autocast (bf16/fp16) each one keeps
      its own cast copy (b H each: q, k, v, gate, up read the fp32 stream; peft casts a LoRA
      input per module); in fp32 the norm's output is one tensor all share.
    * attention: q and k after the rotary embedding, v, the output (b each; it is also o_proj's
      input), the fp32 logsumexp per head, and the additive mask a padded batch turns into
      (b per key position). Flash / memory-efficient SDPA keeps no [T, T] probabilities.
      GQA: k and v stay kv-sized (torch's SDPA takes grouped heads; on a padded GPU batch
      transformers repeats them, which is within this estimate's tolerance).
    * MLP: gate, up and silu(gate) (b I each, the element-wise product's and SiLU's inputs),
      and the product when down_proj trains (b I).
    * LoRA: each adapter's r-wide middle (b r).
    The stream between layers is counted by the next layer's norm (or by checkpointing)."""
    b = PRECISION_BYTES[spec.precision]
    h, q, kv, inter = shape.hidden_size, shape.q_size, shape.kv_size, shape.intermediate_size
    full = spec.adapter.kind != "lora"
    targets = set(spec.adapter.target_modules) if not full else set()

    def keeps_input(module: str) -> bool:
        return full or module in targets

    norms = 2 * 4 * h + (2 * 4 * h if full else 0)
    for readers in (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")):
        keepers = sum(keeps_input(m) for m in readers)
        norms += keepers * b * h if b < 4 else (4 * h if keepers else 0)
    attention = b * (2 * q + 2 * kv) + 4 * shape.num_heads + b * key_len
    if b < 4 and "o_proj" in targets:
        attention += b * q  # peft's cast copy of the attention output
    mlp = 3 * b * inter + (b * inter if keeps_input("down_proj") else 0)
    adapters = len(targets) * spec.adapter.r * b
    return norms + attention + mlp + adapters


def _tokens(spec: JobSpec, micro: int, rows: int, shared: bool) -> tuple[int, int]:
    """(tokens through the layers, logit positions kept) of one micro-batch, every row full.
    The shared-prompt layout (trainer.tokenize.SharedPrefix, CPU only) runs a pair's or
    group's prompt once: micro × (P − 1) prompt tokens plus each row's 1 + C."""
    prompt, completion = spec.max_prompt_length, spec.max_length - spec.max_prompt_length
    if shared:
        return micro * (prompt - 1) + rows * (completion + 1), rows * completion
    return rows * spec.max_length, rows * completion


def estimate_training_memory(
    spec: JobSpec,
    shape: ModelShape,
    *,
    grad_accum: int | None = None,
    checkpointing: bool = False,
    world: int = 1,
    chunked_logps: bool = True,
    device: str = "cpu",
    training_file_bytes: int = 0,
    training_records: int = 0,
) -> MemoryEstimate:
    """Peak memory of one of `world` training processes of `spec` on a model of `shape`, with
    `grad_accum` micro-steps (None: the spec's, else 1) and per-layer activation
    `checkpointing` (see the module docstring for each part). `chunked_logps` False prices the
    old full-logits path (the GPU calibration points were measured on it). `device` "cpu" or
    "cuda" sets the runtime part. Pure: no I/O, no torch."""
    lora = spec.adapter.kind == "lora"
    b = PRECISION_BYTES[spec.precision]  # compute precision (autocast) of the forward
    n_params = shape.params
    trainable = shape.lora_params(spec.adapter.r, spec.adapter.target_modules) if lora else n_params
    h, v = shape.hidden_size, shape.vocab_size
    online = spec.online
    fsdp = spec.parallelism.fsdp
    shards = world if fsdp else 1

    # --- static: weights, gradients and AdamW, the reference, the data ----------------------
    layer_params = (n_params - shape.vocab_size * h) // shape.num_layers  # upper bound
    head_params = shape.vocab_size * h * (1 if shape.tie_word_embeddings else 2)
    if lora:
        weights = n_params * b // shards + trainable * 4
    else:
        weights = n_params * 4 // shards
        if b < 4 and not fsdp:
            weights += n_params * b  # autocast's cast of each weight, kept for backward
    if fsdp:  # a layer gathered whole (and the next, prefetched), the root's embeddings/head
        weights += (2 * layer_params + head_params) * b
    optimizer = trainable * (4 + 8) // shards  # fp32 gradients, AdamW's two moments
    accum = grad_accum or spec.grad_accum or 1
    per_process = spec.examples_per_batch // world
    micro_examples = max(1, per_process // accum)
    seqs_per_example = spec.rows_per_example
    rows = micro_examples * seqs_per_example  # rows scored with a graph
    aux = micro_examples if spec.objective.name == "kto" else 0  # mismatched pairs, no_grad
    length = spec.max_length
    if not spec.needs_reference:  # SFT: no reference model at all
        reference = 0
    elif spec.sync_policy.moves:  # k micro-batches of fp32 log-probs per sync (Lookahead)
        k = spec.humanline_params.sync_every if spec.sync_policy.periodic else 1
        reference = k * accum * (rows + aux) * length * 4
    else:
        reference = 0 if lora else n_params * 4 // shards  # adapter off, or a frozen copy
    data = int(training_file_bytes * DATA_BYTES_PER_FILE_BYTE)
    data += training_records * DATA_BYTES_PER_RECORD

    # --- one training step: activations and log-probs of one micro-batch -------------------
    shared = device == "cpu" and not checkpointing and seqs_per_example > 1
    tokens, kept = _tokens(spec, micro_examples, rows, shared)
    per_layer = layer_bytes(shape, spec, length)
    stream = 4 if not lora else b  # the residual stream: fp32 under fp32 master weights
    edges = tokens * 4 * 3 * h  # the embeddings' output, the final norm's fp32 saves
    if checkpointing:  # each layer keeps its input; one layer recomputed, plus its gradients
        saved, backward = tokens * shape.num_layers * stream * h, tokens * 2 * per_layer
    else:  # every layer's saves; in backward, the layer being differentiated's gradients
        saved, backward = tokens * shape.num_layers * per_layer, tokens * per_layer
    activations = saved + backward + edges
    if shared:  # each row's own copy of its prompt's keys and values, every layer
        activations += (
            rows * (spec.max_prompt_length - 1) * shape.num_layers * 2 * shape.kv_size * stream
        )
    low = b if b < 4 else 0  # the matmul's own output before the fp32 upcast
    if chunked_logps:
        # the head's transient and a layer's backward come one after the other, not together:
        # the step's peak is the larger of the two (the head's saves are held throughout)
        keep = keeps_softmax(spec, shape, checkpointing)
        # KTO's no-grad rows are scored before the step's first graph (trainer.stepwide) and
        # keep nothing (trainer.chunked_logps): they add nothing to the step's peak
        held, head = _chunked_logits(spec, shape, kept, low, stream, lora, keep)
        logits = held + max(0, head - backward)
    else:
        temperature = 4 if spec.logps_temperature != 1.0 else 0
        forward = low + 4 + temperature  # logits, their fp32 copy (and ÷ T)
        backward = 12  # logsumexp's exp, its product with the gradient, gather's zeros: fp32
        elems = kept * v
        aux_elems = aux * (length - spec.max_prompt_length) * v
        logits = max(
            elems * (forward + backward),  # backward starts
            elems * forward + aux_elems * (forward + 4),  # KTO: aux scored, graph held
        )

    # --- online: the sampler ---------------------------------------------------------------
    sampler, transient, fields_sampler = _sampler(spec, shape, n_params)

    batch_fields: tuple[str, ...] = ("batch_size", "grad_accum", "max_length")
    if spec.objective.name == "grpo" and online is not None:
        batch_fields += ("online.num_samples",)
    adapter_fields: tuple[str, ...] = ("adapter.kind", "adapter.r") if lora else ("adapter.kind",)
    return MemoryEstimate(
        parts={
            "runtime": RUNTIME_BYTES_ON[device],
            "weights": weights,
            "gradients and optimizer": optimizer,
            "reference": reference,
            "training data": data,
            "activations": activations,
            "logits": logits,
            "sampler": sampler,
        },
        fields={
            "weights": ("base_model", "adapter.kind", "precision"),
            "gradients and optimizer": adapter_fields + ("base_model",),
            "reference": ("reference_sync", "adapter.kind")
            if not spec.sync_policy.moves
            else ("humanline_params.sync_every", "grad_accum"),
            "training data": ("training_file",),
            "activations": batch_fields + ("base_model",),
            "logits": batch_fields + ("base_model",),
            "sampler": fields_sampler,
        },
        transient=transient,
    )


def keeps_softmax(spec: JobSpec, shape: ModelShape, checkpointing: bool) -> bool:
    """Whether the chunked head keeps its softmax for backward rather than recomputing it:
    never under activation checkpointing, else when 4·V bytes a token are at most
    SOFTMAX_KEEP_SHARE of the layers' saves a token (`layer_bytes` x layers)."""
    if checkpointing:
        return False
    layers = shape.num_layers * layer_bytes(shape, spec, spec.max_length)
    return 4 * shape.vocab_size <= SOFTMAX_KEEP_SHARE * layers


def _chunked_logits(
    spec: JobSpec, shape: ModelShape, kept: int, low: int, stream: int, lora: bool, keep: bool
) -> tuple[int, int]:
    """trainer.chunked_logps: `chunk` tokens' logits at a time (fp32 ≤ LOGPS_CHUNK_BYTES).
    Forward: the chunk's matmul output, its fp32 copy and logsumexp's exp. Backward: the chunk
    recomputed, its fp32 gradient (in place) and that cast back, and a trained head's fp32
    gradient sum [V, H] (+ the compute-precision product and the head's cast copy). Kept for
    backward: the hidden states it projects and one fp32 logsumexp per token. With `keep`,
    every kept token's fp32 softmax too, from the forward's end until the head's backward has
    run (autograd frees a node's saves then, before the layers' backward), and no recompute:
    counted as the head's transient, not as held. Returns (kept for backward, the larger of
    the forward's and the backward's transients)."""
    v, h = shape.vocab_size, shape.hidden_size
    chunk = min(kept, max(LOGPS_MIN_CHUNK, LOGPS_CHUNK_BYTES // (4 * v)))
    forward = chunk * v * (low + 4 + 4)
    backward = chunk * v * (2 * low + 4)
    saved = kept * (stream * h + 4)
    if keep:  # the softmax is the forward's fp32 copy, kept; each pass casts a chunk once
        forward = backward = kept * v * 4 + chunk * v * low
    if not lora:  # the head trains: its gradient summed in fp32, the cast weight, the product
        backward += v * h * (4 + 2 * low)
    return saved, max(forward, backward)


def _sampler(
    spec: JobSpec, shape: ModelShape, n_params: int
) -> tuple[int, tuple[str, ...], tuple[str, ...]]:
    """Online jobs' sampler: (bytes, whether it is transient, its fields)."""
    online = spec.online
    if online is None:
        return 0, ("sampler",), ()
    lora = spec.adapter.kind == "lora"
    b = PRECISION_BYTES[spec.precision]
    h, inter, v = shape.hidden_size, shape.intermediate_size, shape.vocab_size
    n = online.num_samples
    sample_rows = max(1, SAMPLER_ROWS // n) * n
    context = spec.max_prompt_length + online.max_new_tokens
    kv_bytes = 4 if not lora else b
    kv_cache = 2 * shape.num_layers * shape.kv_size * context * sample_rows * kv_bytes
    prefill = sample_rows * spec.max_prompt_length * (2 * h + 2 * inter) * kv_bytes
    sampler = kv_cache + prefill + sample_rows * context * context + sample_rows * v * 4
    fields = ("online.num_samples", "online.max_new_tokens", "max_prompt_length")
    if online.engine not in ("vllm", "auto"):
        if spec.parallelism.fsdp:  # a sharded policy samples from a whole copy per rank
            sampler += n_params * (b if lora else 4)  # (trainer.sampling.gathered), per round
        return sampler, ("sampler",), fields  # generate's cache: between steps, not during one
    dtype = online.vllm.dtype
    engine_b = PRECISION_BYTES[spec.precision] if dtype == "auto" else ENGINE_BYTES[dtype]
    cache = online.vllm.kv_cache_gib
    # a second copy of the weights and its own cache, held through training
    sampler = n_params * engine_b + (int(cache * GiB) if cache is not None else kv_cache)
    return sampler, (), fields + ("online.engine", "online.vllm.kv_cache_gib")
