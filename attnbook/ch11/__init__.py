"""Chapter 11, *Serving attention*: paged caches, prefix sharing, scheduling, quantised caches,
speculative verification, and a Llama-style decoder checked against Hugging Face.

Where things are (every public name is re-exported here, so ``from attnbook.ch11 import X`` works):

==========================  ==========================================================================
:mod:`attnlib.paged`        the paged KV cache: :class:`BlockPool`, :class:`PagedKVCache`, :func:`paged_attention`
                            (gathered), :func:`paged_attention_in_place`, :func:`contiguous_attention`
:mod:`.paging`              memory policies on a mix of requests (:func:`request_mix`, :func:`memory_waste`),
                            copy-on-write (:func:`cow_demo`), prefix sharing (:class:`PrefixCache`), the slider
                            of a pool filling up (:func:`paging_frame`)
:mod:`.simulation`          static against continuous batching with chunked prefill (:func:`simulate`)
:mod:`.quant`               int8 per token or per channel, float8 and KIVI-like caches (:func:`quantize`)
:mod:`.speculative`         speculative decoding's verification with cache rollback
:mod:`.sinks`               attention with sink tokens and a learned sink logit (:class:`SinkLM`)
:mod:`.model`               a Llama/Mistral decoder on a Hugging Face model's weights (:func:`llama_decode_step`)
:mod:`.checkers`            the exercises' checkers (Mistake tables run through :mod:`attnbook.feedback`)
==========================  ==========================================================================

Shapes: ``H`` query heads, ``H_kv`` key/value heads, ``S`` positions, ``D_k`` head width,
``N`` physical blocks, ``b`` positions per block. Every public function checks its arguments and
raises ``ValueError`` naming the argument.
"""

from __future__ import annotations

from attnlib.paged import BlockPool, PagedKVCache, contiguous_attention, paged_attention, paged_attention_in_place

from .checkers import (BLOCKS_CASES, BLOCKS_MISTAKES, COW_CASES, COW_MISTAKES, INT8_CASES, INT8_MISTAKES, SINK_CASES, SINK_MISTAKES,
                       check_blocks_needed, check_cow_table, check_int8_per_token, check_sink_softmax, reference_blocks_needed,
                       reference_cow_table, reference_int8_per_token, reference_sink_softmax)
from .model import attnlib_cached_logits, hf_cached_logits, llama_decode_step, llama_weights, rope, tiny_hf_models
from .paging import (PrefixCache, block_hashes, cow_demo, memory_waste, paging_frame, request_mix, reserved_positions,
                     simulate_paging)
from .quant import dequantize, kivi_roundtrip, quantize, quantized_bytes, quantized_cache_errors, with_key_outliers
from .simulation import Request, StepCost, poisson_arrivals, simulate
from .sinks import (SINK_CHECKPOINT, SinkLM, load_sink_models, nothing_to_attend, sink_attention, sink_logsumexp, stream_loss,
                    train_sink_lm)
from .speculative import speculative_generate
from . import diagrams as _diagrams  # noqa: F401  (registers the chapter's diagrams)

__all__ = [
    "BlockPool", "PagedKVCache", "paged_attention", "paged_attention_in_place", "contiguous_attention",
    "request_mix", "reserved_positions", "memory_waste", "cow_demo",
    "block_hashes", "PrefixCache",
    "Request", "poisson_arrivals", "simulate", "StepCost",
    "quantize", "dequantize", "kivi_roundtrip", "quantized_bytes", "quantized_cache_errors", "with_key_outliers",
    "speculative_generate",
    "sink_attention", "sink_logsumexp", "nothing_to_attend", "SinkLM", "stream_loss", "train_sink_lm", "load_sink_models", "SINK_CHECKPOINT",
    "llama_weights", "llama_decode_step", "rope", "hf_cached_logits", "attnlib_cached_logits", "tiny_hf_models",
    "simulate_paging", "paging_frame",
    "reference_blocks_needed", "BLOCKS_CASES", "BLOCKS_MISTAKES", "check_blocks_needed",
    "reference_cow_table", "COW_CASES", "COW_MISTAKES", "check_cow_table",
    "reference_int8_per_token", "INT8_CASES", "INT8_MISTAKES", "check_int8_per_token",
    "reference_sink_softmax", "SINK_CASES", "SINK_MISTAKES", "check_sink_softmax",
]  # fmt: skip
