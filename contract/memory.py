"""How much memory one training process of a job will need at its peak: an estimate made from
the spec and the base model's shape, before anything is loaded (issue 14; DESIGN.md §6).

Torch-free (the API imports it): `estimate_training_memory` is one pure function of the spec, a
`ModelShape` (read from the model's config.json, `ModelShape.from_config`, or the built-ins'
`BUILTIN_SHAPES`) and the training file's size. The API refuses a job whose estimate is above
the operator's `CAP_TRAIN_MEMORY_GIB` (api.caps.check_memory), naming the fields that drive it.

The estimate is per training process (a process holds the whole model under DDP; FSDP divides
weights, gradients and AdamW state by the processes, which are not known at submit time, so
one process is assumed). It is host RAM on a CPU worker and device memory on a GPU. What it
counts, each a part of `MemoryEstimate.parts` (bytes):

* `runtime`: the process itself (Python, torch, transformers: ~0.55 GiB of RSS on a CPU;
  a CUDA context is about as large).
* `weights`: full fine-tuning keeps fp32 master weights (4 B/parameter) whatever the precision;
  LoRA stores the frozen base in `precision` (fp32 4, bf16/fp16 2 B) plus the fp32 adapter.
  bf16/fp16 autocast of a full fine-tune also holds a low-precision copy of the weights.
* `gradients and optimizer`: fp32 gradients and AdamW's two moments of every trainable
  parameter (4 + 8 B each): the whole model for a full fine-tune, the adapter for LoRA.
* `reference`: a frozen copy of the initial weights when a full fine-tune's reference never
  moves (`reference_sync: none`, offline); LoRA's reference is the adapter switched off and a
  moving reference keeps k batches of log-probs (trainer.reference).
* `activations`: what autograd keeps for backward on one micro-batch (rows × max_length tokens
  × layers, per token and layer the tensors a Llama decoder layer saves: norms in fp32, q/k/v,
  rotary outputs, repeated k/v, attention output, the MLP's four intermediates), plus the
  micro-batch's [rows, max_length, max_length] attention mask.
* `logits`: the vocabulary projection of the completion positions: the logits in the compute
  precision, their fp32 copy, and backward's two fp32 temporaries (KTO's mismatched rows are
  scored under no_grad, so only their forward's logits count, while the graph is held).
* `sampler`: online jobs. transformers' `generate` holds a KV cache for up to 64 rows of
  prompt + new tokens (between steps, so it competes with a step rather than adding to it);
  vLLM (`engine` vllm or auto) holds a second copy of the weights and its KV cache
  (`online.vllm.kv_cache_gib`, or the same 64 rows) through training.
* `training data`: the tokenised training file (trainer.datastore): its memory-mapped token
  ids (4 bytes a token; the pages an epoch touches count as resident), bounded by the file's
  size for text of 4 or more bytes a token, and 80 bytes of offsets a record.

A micro-batch is `batch_size / grad_accum` examples (GRPO: sequences), every row assumed
`max_length` tokens long (the worst case: rows are padded to the batch's longest). The peak is
the static parts plus the larger of a training step (activations + logits) and a sampling round.
The constants were calibrated against measured peaks (tests/contract/test_memory.py states the
factor it holds to; docs/reliability.md lists the figures).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from contract.spec import JobSpec

GiB = 1 << 30
RUNTIME_BYTES = int(0.6 * GiB)
SAMPLER_ROWS = 64  # rows decoded together: trainer.sampling.hf_engine.HFSampler's default
DATA_BYTES_PER_FILE_BYTE = 1.0
DATA_BYTES_PER_RECORD = 80  # a record's offsets: 32 bytes per sequence, 8 per example
PRECISION_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
ENGINE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer that memory depends on (fields in this order:
    `BUILTIN_SHAPES` lists them positionally)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool = False

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModelShape:
        """From a Hugging Face config.json (Llama names, with GPT-2's as fallbacks; a
        multimodal config's `text_config` is used when present). Missing sizes follow the
        usual defaults (MLP 4 × hidden, one KV head per head); ValueError when the config
        names no hidden size, layer count or vocabulary."""
        config = config.get("text_config") or config

        def get(*names: str, default: Any = None) -> Any:
            for name in names:
                value = config.get(name)
                if value is not None:
                    return value
            if default is None:
                raise ValueError(f"config.json has none of {', '.join(names)}")
            return default

        hidden = int(get("hidden_size", "n_embd", "d_model"))
        heads = int(get("num_attention_heads", "n_head", "num_heads"))
        return cls(
            vocab_size=int(get("vocab_size")),
            hidden_size=hidden,
            intermediate_size=int(
                get("intermediate_size", "n_inner", "ffn_dim", default=4 * hidden)
            ),
            num_layers=int(get("num_hidden_layers", "n_layer", "num_layers")),
            num_heads=heads,
            num_kv_heads=int(get("num_key_value_heads", default=heads)),
            head_dim=int(get("head_dim", default=hidden // heads)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        )

    def llama_config(self) -> dict[str, Any]:
        """These sizes under a Hugging Face LlamaConfig's names (the inverse of from_config)."""
        return {
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "tie_word_embeddings": self.tie_word_embeddings,
        }

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def projections(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear layer of a decoder layer, by module name."""
        h, i = self.hidden_size, self.intermediate_size
        return {
            "q_proj": (h, self.q_size),
            "k_proj": (h, self.kv_size),
            "v_proj": (h, self.kv_size),
            "o_proj": (self.q_size, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    @property
    def params(self) -> int:
        """Parameters: embeddings, the output layer unless tied, layers and norms."""
        h = self.hidden_size
        layer = sum(a * b for a, b in self.projections().values()) + 2 * h
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return self.vocab_size * h + head + self.num_layers * layer + h

    def lora_params(self, r: int, target_modules: list[str]) -> int:
        """Adapter parameters: r × (in + out) per targeted projection per layer. A name that
        is not a Llama projection counts as the largest one (conservative)."""
        dims = self.projections()
        largest = max(a + b for a, b in dims.values())
        per_layer = sum(sum(dims[m]) if m in dims else largest for m in target_modules)
        return r * per_layer * self.num_layers


# The built-in models' names: the job spec's base_model, and SmolLM2's public (Hugging Face
# hub) name, which an exported model names as its base and base_model may use as an alias.
SMOLLM2, SMOLLM2_PUBLIC, TINY_LLAMA = (
    "smollm2-135m-instruct",
    "HuggingFaceTB/SmolLM2-135M-Instruct",
    "tiny-llama",
)
# The built-in models' shapes (trainer.modeling.sources builds them; a test checks these
# against the config.json each build writes), so the API needs no model on its disk.
BUILTIN_SHAPES: dict[str, ModelShape] = {
    SMOLLM2: ModelShape(49152, 576, 1536, 30, 9, 3, 64, True),
    TINY_LLAMA: ModelShape(512, 64, 128, 2, 4, 2, 16, True),
}
BUILTIN_SHAPES[SMOLLM2_PUBLIC] = BUILTIN_SHAPES[SMOLLM2]


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


def estimate_training_memory(
    spec: JobSpec, shape: ModelShape, *, training_file_bytes: int = 0, training_records: int = 0
) -> MemoryEstimate:
    """Peak memory of one training process of `spec` on a model of `shape` (see the module
    docstring for what each part counts). Pure: no I/O, no torch."""
    lora = spec.adapter.kind == "lora"
    b = PRECISION_BYTES[spec.precision]  # compute precision (autocast) of the forward
    n_params = shape.params
    trainable = shape.lora_params(spec.adapter.r, spec.adapter.target_modules) if lora else n_params
    h, inter, v = shape.hidden_size, shape.intermediate_size, shape.vocab_size
    length = spec.max_length
    online = spec.online

    # --- static: weights, gradients and AdamW, the reference, the data ----------------------
    if lora:
        weights = n_params * b + trainable * 4
    else:
        weights = n_params * 4 + (n_params * b if b < 4 else 0)  # autocast's weight copies
    optimizer = trainable * (4 + 8)
    accum = spec.grad_accum or 1
    micro_examples = max(1, spec.examples_per_batch // accum)
    seqs_per_example = {"dpo": 2, "kto": 1, "grpo": spec.group_size}[spec.objective.name]
    rows = micro_examples * seqs_per_example  # rows scored with a graph
    aux = micro_examples if spec.objective.name == "kto" else 0  # mismatched pairs, no_grad
    if spec.sync_policy.moves:  # k micro-batches of fp32 log-probs per sync (Lookahead)
        k = spec.humanline_params.sync_every if spec.sync_policy.periodic else 1
        reference = k * accum * (rows + aux) * length * 4
    else:
        reference = 0 if lora else n_params * 4  # adapter off, or a frozen fp32 copy
    data = int(training_file_bytes * DATA_BYTES_PER_FILE_BYTE)
    data += training_records * DATA_BYTES_PER_RECORD

    # --- one training step: activations and logits of one micro-batch ----------------------
    q, kv = shape.q_size, shape.kv_size
    matmul_outputs = 7 * q + 3 * kv + 4 * inter  # q k v, rotary, repeated k/v, attention, MLP
    per_token_layer = 4 * 4 * h + b * matmul_outputs + (2 * 5 * h if b < 4 else 0)
    per_token = shape.num_layers * per_token_layer + 4 * 3 * h  # + embeddings, final norm
    activations = rows * length * per_token + rows * length * length  # + the bool mask
    temperature = 4 if spec.logps_temperature != 1.0 else 0
    forward = (b if b < 4 else 0) + 4 + temperature  # logits, their fp32 copy (and ÷ T)
    backward = 8  # logsumexp's exp and the gradient, fp32
    elems = length * v
    logits = max(
        rows * elems * (forward + backward),  # backward starts
        rows * elems * forward + aux * elems * (forward + 4),  # KTO: aux scored, graph held
    )

    # --- online: the sampler ---------------------------------------------------------------
    sampler = 0
    transient: tuple[str, ...] = ("sampler",)  # generate's cache: between steps, not during one
    fields_sampler: tuple[str, ...] = ()
    if online is not None:
        n = online.num_samples
        sample_rows = max(1, SAMPLER_ROWS // n) * n
        context = spec.max_prompt_length + online.max_new_tokens
        kv_bytes = 4 if not lora else b
        kv_cache = 2 * shape.num_layers * kv * context * sample_rows * kv_bytes
        prefill = sample_rows * spec.max_prompt_length * (2 * h + 2 * inter) * kv_bytes
        sampler = kv_cache + prefill + sample_rows * context * context + sample_rows * v * 4
        fields_sampler = ("online.num_samples", "online.max_new_tokens", "max_prompt_length")
        if online.engine in ("vllm", "auto"):
            dtype = online.vllm.dtype
            engine_b = PRECISION_BYTES[spec.precision] if dtype == "auto" else ENGINE_BYTES[dtype]
            cache = online.vllm.kv_cache_gib
            # a second copy of the weights and its own cache, held through training
            sampler = n_params * engine_b + (int(cache * GiB) if cache is not None else kv_cache)
            transient = ()
            fields_sampler += ("online.engine", "online.vllm.kv_cache_gib")

    batch_fields: tuple[str, ...] = ("batch_size", "grad_accum", "max_length")
    if spec.objective.name == "grpo" and online is not None:
        batch_fields += ("online.num_samples",)
    adapter_fields: tuple[str, ...] = ("adapter.kind", "adapter.r") if lora else ("adapter.kind",)
    return MemoryEstimate(
        parts={
            "runtime": RUNTIME_BYTES,
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
