"""Fast-forward for the scheduler: runs of engine steps done at once, with the results of stepping one by one.

Most steps are decode steps in which nothing changes the batch: no arrival, no finish,
no timeout, no admission possible and enough free blocks for every block boundary crossed. A run of k
such steps is done at once: step j's time is linear in j inside the roofline's max (the KV read grows by
one token per request per step), token times are a cumulative sum of the step times in the same order
as step-by-step additions (so bit-identical), and the memory samples come from the policy in closed form.

Three shapes, each used only where it cannot change the outcome:

    _segment                  decode-only steps up to the first finish, arrival, timeout or memory limit
                              (someone may be waiting: the batch stays fixed);
    _segment_through_finishes nobody waits: requests leave as they finish and the batch shrinks inside
                              the run, up to the next arrival or the memory limit;
    _steady_step              one general step whose running requests all decode, plus admissions, with
                              less numpy work than Engine._step.

`fast_forward=False` uses none of them; tests compare the two modes.
"""

from __future__ import annotations

import numpy as np


class FastForward:
    """Mixed into `core.sim_scheduler.Engine`; uses its state and its general-step helpers."""

    def _steady_step(self) -> bool:
        """The common general step, with less numpy work: every running request decodes one token (steady)
        and waiting requests may be admitted. The same integers and the same order of updates as `_step`
        (which `fast_forward=False` uses for every step; tests compare the two). False: take `_step`."""
        run = self.run_arr
        n = len(run)
        if not self.steady or n == 0 or n > self.cfg.max_batched_tokens:
            return False
        tokens_run = self.computed[run]
        if not self.policy.grow_many(run, tokens_run + 1):
            return False  # memory is short: `_step` preempts
        admitted: list[int] = []
        chunks: list[int] = []
        swap_bytes = self._admit(self.cfg.max_batched_tokens - n, admitted, chunks)
        context = int(tokens_run.sum()) + n  # decode: Σ (c + 1) positions attended
        tokens, positions, moved = n, context, context + n
        starts = [int(self.computed[rid]) for rid in admitted]
        for start, new in zip(starts, chunks, strict=True):
            tokens += new
            positions += start * new + new * (new + 1) // 2
            moved += start + 2 * new
        excess = (0.0, 0.0)
        if self.st.sliding_share:
            excess = self.st.chunk_excess(np.concatenate([tokens_run, np.array(starts, np.int64)]),
                                          np.concatenate([np.ones(n, np.int64), np.array(chunks, np.int64)]))
        d = float(self.st.step_s(float(tokens), float(positions), float(moved), swap_bytes, *excess))
        self.computed[run] = tokens_run + 1
        sampled_admitted = []
        for rid, start, new in zip(admitted, starts, chunks, strict=True):
            self.computed[rid] = start + new
            if start + new == self.prompt[rid] + self.generated[rid]:
                sampled_admitted.append(rid)
        self._finished_now = 0
        parts, table_bytes = self.policy.parts(self.computed[self.run_arr], self._head())
        self._account(d, parts, table_bytes)
        self.now += d
        self.busy_s += d
        self.steps += 1
        self.itl_v.append(self.now - self.last_token[run])
        self.itl_w.append(1)
        later = [rid for rid in sampled_admitted if not np.isnan(self.first_token[rid])]
        if later:
            self.itl_v.append(self.now - self.last_token[later])
            self.itl_w.append(1)
        for rid in sampled_admitted:
            if np.isnan(self.first_token[rid]):
                self.first_token[rid] = self.now
        self.last_token[run] = self.now
        self.generated[run] += 1
        sampled = run
        if sampled_admitted:
            sampled = np.concatenate([run, np.array(sampled_admitted, np.int64)])
            self.last_token[sampled_admitted] = self.now
            self.generated[sampled_admitted] += 1
        self._finish(sampled)
        self.steady = len(sampled) - self._finished_now == len(self.running)
        return True

    # ---- fast-forward ----------------------------------------------------------------------------
    def _segment_length(self) -> tuple[int, np.ndarray | None]:
        """(how many decode-only steps can be done at once from now — 0: take a general step, plan)."""
        run = self.run_arr
        n = len(run)
        if not self.steady or n == 0 or n > self.cfg.max_batched_tokens:
            return 0, None
        if self.waiting and self._can_admit_head(self.cfg.max_batched_tokens - n):
            return 0, None
        if not self.waiting and self.policy.releases_in_segment:
            return -1, None  # a run through finishes (see _segment_through_finishes)
        k = int(np.min(self.stop_at[run] - self.generated[run]))
        k_memory, plan = self.policy.decode_steps_available(self.computed[run])
        return min(k, k_memory), plan

    def _steps_upto(self, k: int) -> np.ndarray:
        """0, 1, 2, … (at least k of them), kept between runs."""
        if k > len(self._steps_index):
            self._steps_index = np.arange(max(k, 2 * len(self._steps_index)), dtype=np.int64)
        return self._steps_index

    def _excess(self, tokens: np.ndarray, k: int, alive_steps: np.ndarray | None = None) -> np.ndarray | float:
        """Sliding-window excess of k decode steps from requests holding `tokens` (their context in step j is
        tokens + 1 + j); 0.0 without a window."""
        if not self.st.sliding_share:
            return 0.0
        return self.st.decode_excess(tokens + 1, k, alive_steps)

    def _segment(self, k: int, plan: np.ndarray | None) -> bool:
        run = self.run_arr
        n = len(run)
        tokens0 = self.computed[run]
        context0 = int(tokens0.sum()) + n  # Σ (c_i + 1): step j attends context0 + n·j positions
        until = self.arrival_list[self.next_arrival] if self.next_arrival < self.num_requests else np.inf
        until = min(until, self.next_deadline)
        # steps only lengthen (the KV read grows), so no more than (until − now) / d_0 + 1 start before `until`
        if until < np.inf:
            first_s = self.st.decode_steps_s(n, float(context0), float(np.sum(self._excess(tokens0, 1))))
            k = min(k, int((until - self.now) / first_s) + 2)
        steps = self._steps_upto(k + 1)
        d = self.st.decode_steps_s(n, (context0 + n * steps[:k]).astype(np.float64), self._excess(tokens0, k))
        ends = np.empty(k + 1)
        ends[0] = self.now
        ends[1:] = d
        np.cumsum(ends, out=ends)  # ends[j + 1] = end of step j, summed in the order of now += d
        # step j starts at ends[j]; it belongs to this run only if it starts before `until`
        if until < np.inf:
            k = min(k, int(np.searchsorted(ends[:k], until, side="left")))
            if k < 2:
                return False
            d, ends = d[:k], ends[: k + 1]
        parts, table_bytes, new_blocks = self.policy.segment_integrals(tokens0, plan, d, self._head(), steps)
        self.mem += parts
        self.table_byte_s += table_bytes
        span = float(parts.sum()) / self.policy.capacity_slots  # the parts tile the pool: Σ parts = capacity · Σ d
        self.running_s += span * n
        self.in_system_s += span * (n + len(self.waiting))
        if self.timeline is not None:
            self.timeline.append((self.now, float(ends[-1]), n, len(self.waiting), *(parts / span).tolist()))
        self.itl_v.append(ends[1:] - ends[:-1])  # as step by step: now − last token
        self.itl_w.append(n)
        self.computed[run] = tokens0 + k
        self.generated[run] += k
        self.policy.grow_many(run, tokens0 + k, new_blocks)
        self.now = float(ends[-1])
        self.last_token[run] = self.now
        self.busy_s += span
        self.steps += k
        self.segments += 1
        self._finish(run)
        self.steady = True
        return True

    def _segment_through_finishes(self) -> bool:
        """Decode steps with nobody waiting: requests leave as they finish and the batch shrinks, so the
        run goes on until the next arrival (or memory runs short). Step j holds the n_j requests with
        more than j tokens to go; its time uses n_j and their context sum S_j, summed in step order."""
        run = self.run_arr
        tokens0 = self.computed[run]
        remaining = self.stop_at[run] - self.generated[run]
        k = int(remaining.max())
        until = self.arrival_list[self.next_arrival] if self.next_arrival < self.num_requests else np.inf
        if until < np.inf:  # no decode step is shorter than the weights' read + overhead
            floor_s = self.st.step_s(1.0, 0.0, 0.0)
            k = min(k, int((until - self.now) / floor_s) + 2)
        order = np.argsort(remaining, kind="stable")
        by_remaining = remaining[order]
        context_done = np.zeros(len(run) + 1, np.int64)
        np.cumsum(tokens0[order] + 1, out=context_done[1:])
        steps = self._steps_upto(k)[:k]
        gone = np.searchsorted(by_remaining, steps, side="right")  # requests finished before step j
        alive = len(run) - gone
        context = context_done[-1] - context_done[gone] + steps * alive  # Σ over alive of (t_i + 1 + j)
        alive_f, context_f = alive.astype(np.float64), context.astype(np.float64)
        excess = self._excess(tokens0, k, remaining)
        d = self.st.step_s(alive_f, context_f, context_f + alive_f, 0.0, excess, excess)  # ints < 2^53: exact
        ends = np.empty(k + 1)
        ends[0] = self.now
        ends[1:] = d
        np.cumsum(ends, out=ends)
        if until < np.inf:
            k = min(k, int(np.searchsorted(ends[:k], until, side="left")))
        k, parts, table_bytes = self.policy.finish_segment(run, tokens0, remaining, d[:k], context[:k])
        if k < 2:
            return False
        d, ends, alive = d[:k], ends[: k + 1], alive[:k]
        self.mem += parts
        self.table_byte_s += table_bytes
        self.running_s += float(d @ alive)
        self.in_system_s += float(d @ alive)
        span = float(ends[-1] - ends[0])
        if self.timeline is not None:
            self.timeline.append((self.now, float(ends[-1]), len(run), 0, *(parts / float(d.sum())).tolist()))
        self.itl_v.append(np.repeat(ends[1:] - ends[:-1], alive))
        self.itl_w.append(1)
        taken = np.minimum(remaining, k)
        self.computed[run] = tokens0 + taken
        self.generated[run] += taken
        self.last_token[run] = ends[taken]
        # every request's growth at once (checked step by step in finish_segment); the finished ones then
        # release in finishing order, so each takes its last blocks from the pool when they are free
        self.policy.grow_many(run, tokens0 + taken, check=False)
        finished = order[: int(np.searchsorted(by_remaining, k, side="right"))]  # in finishing order
        for i in finished.tolist():
            rid = int(run[i])
            self.now = float(ends[taken[i]])
            self._close(rid)
        self.now = float(ends[-1])
        if len(finished):
            gone_ids = set(run[finished].tolist())
            self.running = [r for r in self.running if r not in gone_ids]
            self._set_running()
        self.busy_s += span
        self.steps += k
        self.segments += 1
        self.steady = True
        return True
