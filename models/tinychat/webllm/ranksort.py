"""``argsort_probs`` for WebLLM's sampler as a rank-count sort (two GPU kernels).

WebLLM calls the model library's ``argsort_probs(probs) -> (sorted_probs,
sorted_indices)`` for every generated token, at temperature 0 too.
mlc-llm builds it on TVM's GPU merge sort, whose WGSL kernel takes
Chromium's software WebGPU adapter (SwiftShader) about nine minutes to
compile. This module builds the same function from two simple kernels
that compile in milliseconds:

1. ``rank[b, j]`` = how many entries of row ``b`` come before entry ``j``
   in descending order, ties broken by the lower index (a stable sort):
   ``#{k : p[k] > p[j]} + #{k < j : p[k] == p[j]}``.
2. ``order[b, r]`` = the index whose rank is ``r``. Ranks are a
   permutation, so exactly one ``k`` matches and the sum of
   ``k * [rank[b, k] == r]`` is that ``k``.

Both are O(vocab²) per row, one GPU thread per output element, the count
kept in a register (1024 x 1024 comparisons for TinyChat: a small part of
a token's time; a vocabulary of 100,000 would want the merge sort). The values are
then gathered as mlc-llm does (``take_sorted_probs``). The kernels carry
their own schedule (dlight's default GPU rules cannot schedule a
reduction that reads two elements of the same row).

``attach_argsort_probs(bb)`` has the signature of mlc-llm's
``compiler_pass.attach_sampler._attach_argsort_func`` (at the commit
``build_webllm.py`` pins), which ``mlc_compat`` replaces with it.
"""

from __future__ import annotations

from typing import Any

#: GPU threads per block of both kernels.
THREADS = 256


def _scheduled(args: list[Any], block: str) -> Any:
    """A PrimFunc of the te ``args``: one thread per output element, register accumulator."""
    from tvm import s_tir, te

    schedule = s_tir.Schedule(te.create_prim_func(args))
    sblock = schedule.get_sblock(block)
    row, col, _reduce = schedule.get_loops(sblock)
    blocks, threads = schedule.split(schedule.fuse(row, col), [None, THREADS])
    schedule.bind(blocks, "blockIdx.x")
    schedule.bind(threads, "threadIdx.x")
    local = schedule.cache_write(sblock, 0, "local")
    schedule.reverse_compute_at(local, threads)
    func = schedule.mod["main"]
    return func.with_attr("tirx.is_scheduled", True).without_attr("global_symbol")


def rank_count_kernels(batch: Any, vocab: Any) -> tuple[Any, Any]:
    """(rank kernel, order kernel) for float32 ``probs`` of shape (batch, vocab); int32 out."""
    from tvm import te, tirx

    one, zero = tirx.IntImm("int32", 1), tirx.IntImm("int32", 0)
    probs = te.placeholder((batch, vocab), "float32", name="probs")
    k = te.reduce_axis((0, vocab), name="k")

    def before(b: Any, j: Any) -> Any:
        ahead = tirx.Or(probs[b, k] > probs[b, j], tirx.And(probs[b, k] == probs[b, j], k < j))
        return te.sum(tirx.Select(ahead, one, zero), axis=k)

    rank = te.compute((batch, vocab), before, name="rank_count")
    ranks = te.placeholder((batch, vocab), "int32", name="ranks")
    m = te.reduce_axis((0, vocab), name="m")

    def holder(b: Any, r: Any) -> Any:
        match = ranks[b, m] == r.astype("int32")
        return te.sum(tirx.Select(match, m.astype("int32"), zero), axis=m)

    order = te.compute((batch, vocab), holder, name="rank_order")
    return _scheduled([probs, rank], "rank_count"), _scheduled([ranks, order], "rank_order")


def attach_argsort_probs(bb: Any) -> Any:
    """Add ``argsort_probs`` (descending, stable) to relax BlockBuilder ``bb``; its GlobalVar."""
    from tvm import relax, te, tirx

    batch = tirx.SizeVar("batch_size", "int64")
    vocab = tirx.SizeVar("vocab_size", "int64")
    rank_func, order_func = rank_count_kernels(batch, vocab)
    rank_gv = bb.add_func(rank_func, "rank_count")
    order_gv = bb.add_func(order_func, "rank_order")
    probs = relax.Var("probs", relax.TensorStructInfo((batch, vocab), "float32"))
    indices_info = relax.TensorStructInfo((batch, vocab), "int32")
    with bb.function("argsort_probs", [probs]):
        with bb.dataflow():
            ranks = bb.emit(relax.call_tir(rank_gv, [probs], out_sinfo=indices_info))
            order = bb.emit(relax.call_tir(order_gv, [ranks], out_sinfo=indices_info))
            values = bb.emit_te(
                lambda p, idx: te.compute(
                    (batch, vocab), lambda b, j: p[b, idx[b, j]], name="take_sorted_probs"
                ),
                probs,
                order,
                primfunc_name_hint="take_sorted_probs",
            )
            output = bb.emit_output((values, order))
        return bb.emit_func_output(output)
