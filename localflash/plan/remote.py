"""Remote devices in a plan: what stays local, and what one verify pass sends over the network.

The devices themselves are asked over the wire by :mod:`localflash.llama.rpc_wire` (no llama.cpp loaded).
"""

from __future__ import annotations

from localflash.llama.rpc_wire import parse_endpoints, probe, rpc_check_rows  # noqa: F401  (for cli/ and serve/)


# the output layer's tensors (a tied head is the token embedding, duplicated): kept on the host when
# the last device of the split is remote, so the drafter (local) can borrow them and logits stay here
OUTPUT_PATTERN = r"^(output|output_norm|token_embd)\.weight$"


def traffic_per_pass(target, where: list[int | None], endpoints: list[str | None], rows: int, n_ctx: int,
                     taps: list[int] = ()) -> dict:
    """Expected network use of one verify pass of ``rows`` tokens over a layer split with remote devices.

    ``where``: device (position in ``endpoints``) of every block slot, None for the host (last slot:
    the output layer); ``endpoints``: each device's rpc-server, None for a local card. Per pass every
    remote device that holds blocks receives the hidden states entering its first block and returns
    those leaving its last (f32, ``rows × n_embd`` each way; between two servers they pass through this
    machine), plus its copy of the attention mask (f16, ``n_kv × rows``; n_kv grows with the tokens
    cached: given here at ``n_ctx``, the most); a DFlash or EAGLE-3 drafter's tapped layer inputs
    (``taps``) made on a remote device come back too. Graph uploads (when a pass's shape differs from
    the last one's) come on top; docs/benchmarks.md has measured totals.

    Round trips: llama.cpp's RPC client queues the input copies and the graph compute of a device
    without waiting and blocks on one read of its output, so a pass costs one round trip per remote
    device whatever its row count (16 rows: the same as one), plus one per tap read from a remote
    device.
    """
    remote = sorted({where[il] for il in range(len(where) - 1) if where[il] is not None and endpoints[where[il]]})
    act = rows * target.n_embd * 4
    mask = n_ctx * rows * 2
    remote_taps = [lid for lid in taps if 0 < lid <= len(where) - 1 and where[lid - 1] is not None and endpoints[where[lid - 1]]]
    return {
        "rows": rows,
        "remote_devices": len(remote),
        "activations_bytes": 2 * act * len(remote),
        "tap_bytes": act * len(remote_taps),
        "mask_bytes_at_n_ctx": mask * len(remote),
        "bytes": (2 * act + mask + rows * 4) * len(remote) + act * len(remote_taps),
        "round_trips": len(remote) + len(remote_taps),
    }


def reachable(endpoints: list[str], timeout: float = 3.0) -> tuple[list[str], list[tuple[str, str]]]:
    """(the endpoints that answer a probe, [(endpoint, why not)] for the others)."""
    from localflash.errors import LocalflashError

    up, down = [], []
    for e in endpoints:
        try:
            probe(e, timeout)
            up.append(e)
        except LocalflashError as err:
            down.append((e, err.message))
    return up, down
