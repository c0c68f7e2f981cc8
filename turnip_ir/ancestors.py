"""Happens-before questions over a DAG, answered in one compiled sweep with small ancestor sets.

The memory passes and the verifier ask "is u an ancestor of w?" only for nodes they can name in
advance: the last writers of the bytes w overwrites and their readers (turnip_ir/last_writer.py), or the
sources of memory edges. `ancestor_answers` takes those questions (per node w, the nodes asked
about) and visits the nodes in position order, a topological order. Each visited node gets the set
of its *watched* ancestors: the union, over its predecessors, of their sets and their own bits. A
node is watched, holding a bit, from its visit to the last question about it, so the sets hold
about as many bits as nodes are watched at once (a few hundred on a 280k-node memgraph), not one bit
per node: the sweep costs O(edges x watched / 64) word operations instead of O(edges x n / 64).

Exactness: a bit is an id, reused once its node is no longer watched. Ids are recycled in batches,
after clearing them from every set still held, so a recycled id never carries an old node's
ancestry; a node that is not watched (never asked about, or not yet visited) has no bit and is
answered "not an ancestor". A set is dropped after its node's last successor is visited.
`implied_predecessors` runs the same sweep for a transitive reduction: visiting each node's
predecessors latest first, it marks those that a later one already reaches.

Compiled with numba (cached on disk beside this file).
"""

from __future__ import annotations

import numpy as np
from numba import njit


def ancestor_answers(pred_ptr, pred_idx, ask_ptr, ask_idx) -> np.ndarray:
    """For every question k (node `ask_idx[k]` asked at node w, ask_ptr indexing by w): is it an ancestor of w?"""
    asker = np.repeat(np.arange(len(ask_ptr) - 1, dtype=np.int64), np.diff(ask_ptr))
    return _sweep(pred_ptr, pred_idx, _last_question(len(ask_ptr) - 1, ask_idx, asker), ask_ptr, ask_idx, False)


def implied_predecessors(pred_ptr, pred_idx, mem_ptr, mem_idx) -> np.ndarray:
    """For every predecessor entry (rows sorted latest first): does a later predecessor of the same node reach it?

    Only the sources of memory edges (`mem_*`) are watched, so only their entries can be marked.
    """
    n = len(pred_ptr) - 1
    asker = np.repeat(np.arange(n, dtype=np.int64), np.diff(mem_ptr))
    return _sweep(pred_ptr, pred_idx, _last_question(n, mem_idx, asker), pred_ptr, pred_idx, True)


def _last_question(n: int, asked: np.ndarray, asker: np.ndarray) -> np.ndarray:
    until = np.full(n, -1, dtype=np.int64)
    np.maximum.at(until, asked, asker)
    return until


@njit(cache=True)
def _sweep(pred_ptr, pred_idx, until, ask_ptr, ask_idx, reducing):
    n = pred_ptr.shape[0] - 1
    left = np.zeros(n, np.int64)
    for e in range(pred_idx.shape[0]):
        left[pred_idx[e]] += 1
    ends_ptr, ends_idx, most = _watch_ends(until)
    capacity = 2 * most + 64
    words = (capacity + 63) // 64
    nid = np.full(n, -1, np.int64)
    free_ids = np.empty(capacity, np.int64)
    free_top, next_id = 0, 0
    dead = np.zeros(words, np.uint64)
    row = np.full(n, -1, np.int64)
    pool = np.zeros((64, words), np.uint64)
    row_owner = np.full(64, -1, np.int64)
    free_rows = np.empty(64, np.int64)
    rows_top = 0
    rows_used = 0
    answers = np.zeros(ask_idx.shape[0], np.bool_)
    acc = np.zeros(words, np.uint64)
    for w in range(n):
        for j in range(words):
            acc[j] = 0
        for e in range(pred_ptr[w], pred_ptr[w + 1]):
            p = pred_idx[e]
            if reducing and _has(acc, nid[p]):
                answers[e] = True
            else:
                if row[p] >= 0:
                    for j in range(words):
                        acc[j] |= pool[row[p], j]
                if nid[p] >= 0:
                    acc[nid[p] >> 6] |= np.uint64(1) << np.uint64(nid[p] & 63)
            left[p] -= 1
            if left[p] == 0 and row[p] >= 0:
                row_owner[row[p]] = -1
                free_rows[rows_top] = row[p]
                rows_top += 1
                row[p] = -1
        if not reducing:
            for e in range(ask_ptr[w], ask_ptr[w + 1]):
                answers[e] = _has(acc, nid[ask_idx[e]])
        if left[w] > 0 and _nonzero(acc):
            if rows_top == 0:
                if rows_used == pool.shape[0]:
                    pool, row_owner, free_rows = _more_rows(pool, row_owner, free_rows)
                r = rows_used
                rows_used += 1
            else:
                rows_top -= 1
                r = free_rows[rows_top]
            for j in range(words):
                pool[r, j] = acc[j]
            row[w], row_owner[r] = r, w
        for e in range(ends_ptr[w], ends_ptr[w + 1]):
            u = ends_idx[e]
            dead[nid[u] >> 6] |= np.uint64(1) << np.uint64(nid[u] & 63)
            nid[u] = -1
        if until[w] > w:
            if free_top == 0 and next_id == capacity:
                free_top = _recycle(pool, row_owner, rows_used, dead, free_ids)
            if free_top > 0:
                free_top -= 1
                nid[w] = free_ids[free_top]
            else:
                nid[w] = next_id
                next_id += 1
    return answers


@njit(cache=True)
def _nonzero(acc):
    for j in range(acc.shape[0]):
        if acc[j]:
            return True
    return False


@njit(cache=True)
def _has(acc, i):
    return i >= 0 and (acc[i >> 6] >> np.uint64(i & 63)) & np.uint64(1) == 1


@njit(cache=True)
def _watch_ends(until):
    """Nodes by the position of their last question (CSR), for those watched past their own visit,
    and the most watched at once."""
    n = until.shape[0]
    ends_ptr = np.zeros(n + 1, np.int64)
    change = np.zeros(n + 1, np.int64)
    for u in range(n):
        if until[u] > u:
            ends_ptr[until[u] + 1] += 1
            change[u] += 1
            change[until[u]] -= 1
    most, live = 0, 0
    for t in range(n):
        ends_ptr[t + 1] += ends_ptr[t]
        live += change[t]
        most = max(most, live)
    ends_idx = np.empty(ends_ptr[n], np.int64)
    fill = np.zeros(n, np.int64)
    for t in range(n):
        fill[t] = ends_ptr[t]
    for u in range(n):
        if until[u] > u:
            ends_idx[fill[until[u]]] = u
            fill[until[u]] += 1
    return ends_ptr, ends_idx, most


@njit(cache=True)
def _recycle(pool, row_owner, rows_used, dead, free_ids):
    """Clear the dead ids from every held set and make them free; returns how many are free."""
    for r in range(rows_used):
        if row_owner[r] >= 0:
            for j in range(dead.shape[0]):
                pool[r, j] &= ~dead[j]
    top = 0
    for word in range(dead.shape[0]):
        bits = dead[word]
        for b in range(64):
            if (bits >> np.uint64(b)) & np.uint64(1):
                free_ids[top] = word * 64 + b
                top += 1
    for j in range(dead.shape[0]):
        dead[j] = 0
    return top


@njit(cache=True)
def _more_rows(pool, row_owner, free_rows):
    rows = pool.shape[0] * 2
    bigger = np.zeros((rows, pool.shape[1]), np.uint64)
    owners = np.full(rows, -1, np.int64)
    for r in range(pool.shape[0]):
        owners[r] = row_owner[r]
        for j in range(pool.shape[1]):
            bigger[r, j] = pool[r, j]
    return bigger, owners, np.empty(rows, np.int64)
