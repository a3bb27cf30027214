"""verify's model: a small Llama-family transformer, run two ways over the same weights.

* the reference — one request alone, a contiguous KV cache (`contiguous`);
* the path under test — the new tokens of many sequences in one flat batch, K/V in the pool's blocks,
  attention through block tables (`paged`), decode attention behind the `attention_backend` seam.

The model's modules know neither the block pool nor the scheduler: the executor (`executor`) turns the
scheduler's step (core/sim/plan.py's StepPlan) into a `PagedBatch` (plain tensors) plus block copies and
swaps, and calls them. `kvcalc verify` is put together from:

    executor.ModelExecutor(weights, kv, prompts, sampling, attention_backend=, eos_token_id=)
        .execute(StepPlan) -> StepOutcome         swaps, CoW copies, paged_forward, sampling; a shadow of the
                                                  cache (shadow.ShadowKV) checks every context it reads
    beam.paged_beam_search(executor, pool, prompts, width, num_tokens);  beam.reference_beam_search(...)
    scenarios.build(name, vocab, seed, source=None) -> Scenario   the fifteen scenarios and the events each needs
    faults.Fault(name).install(pool)             early-free | skip-cow | stale-hash | no-rollback, planted
    runner.run_scenario(scenario, weights, seed=, attention_backend=, fault=) -> result.ScenarioResult
        (scheduled.run_requests: the one path through scheduler, pool and executor, speculative runs included)
    references.references(weights, requests, seed)   each request alone over a contiguous cache, decoded together
    verdict.compare(references, tests, exact) -> Comparison    fp32 identical tokens, else the top-k rule
    suite.run_verify(VerifyConfig(...), progress) -> outcome.VerifyRun   (.to_dict(): `kvcalc verify --json`)
    gguf_model.load_gguf_model(find_gguf("smollm2-135m")) -> (ModelWeights, GGUFVocab)   a real model, offline
    bpe.ByteBPE(vocab).encode(text) / .decode(ids);  chat.ChatPrompts(tokenizer)         its tokenizer and prompts
    dry_run.cow_tight_fits(...)                   the scheduling of a scenario without a model (pool sizing)

Importing this package does not import torch; its modules do.

    config.ModelConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_layers=2,
                       num_q_heads=4, num_kv_heads=2, head_dim=64, rope_theta=1e4, rms_norm_eps=1e-6,
                       tie_word_embeddings=True, max_position=4096)        frozen; .to_dict()
    weights.init_weights(config, seed=0, dtype="fp32"|"bf16"|"fp16", device="cpu") -> ModelWeights
    weights.to_hf_llama_state_dict(weights) -> {name: tensor}          (names of LlamaForCausalLM)

    contiguous.allocate_contiguous_kv(config, max_len, dtype, device) -> ContiguousKVCache
    contiguous.contiguous_forward(weights, cache, token_ids) -> logits [T, vocab]    (appends T tokens)
    contiguous.reference_generate(weights, prompt_ids, max_new_tokens, sampling=GREEDY,
                                  prefill_chunk_tokens=None) -> Generation(prompt_ids, output_ids, logits)

    paged_batch.PagedBatch(token_ids [N], positions [N], slot_mapping [N], query_start_loc [S+1],
                           seq_lens [S], block_tables [S, max_blocks])      (layout: paged_batch's docstring)
    paged_batch.build_paged_batch([SequenceChunk(token_ids, num_computed_tokens, block_table)], block_size,
                                  device, max_blocks=None) -> PagedBatch
    paged_batch.validate_paged_batch(batch, num_blocks, block_size)       raises InvalidPagedBatch
    paged.allocate_paged_kv(config, num_blocks, block_size, dtype, device) -> PagedKVCache
    paged.paged_forward(weights, kv, batch, *, attention_backend="torch-reference",
                        return_all_logits=False, validate=True) -> logits [S, vocab] (or [N, vocab])
    paged.copy_blocks(kv, [(src, dst), ...])                              copy-on-write, every layer
    paged.swap_out(kv, block_ids) -> SwappedBlocks (CPU);  paged.swap_in(kv, swapped, block_ids)
    attention.default_attention_backend(config, torch_dtype, device, block_size) -> "torch-reference" | "cuda-kernel"

    sampling.SamplingParams(temperature=0.0, top_k=0, seed=0); GREEDY
    sampling.sample_token(logits [vocab], params, position) -> int      (draw depends on (seed, position) only)
    sampling.sample_tokens(logits [S, vocab], params_per_row, positions) -> list[int]
    compare.top_k_ids(logits [vocab], k) -> frozenset[int];  compare.first_mismatch(ref, test) -> int | None
    compare.top_k_rule(ref_tokens, ref_logits, test_tokens, test_logits, k) -> TopKVerdict

Logits are float32 whatever the model dtype. Row s of `paged_forward` predicts the token at position
seq_lens[s]; sample it with `position=seq_lens[s]` so it matches `reference_generate`.
"""
