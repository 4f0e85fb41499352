"""Reads a memgate memory snapshot with Python's pickle and checks it as PyTorch's memory_viz reads it.

    python check_memory_snapshot.py snapshot.pickle [--step-peak BYTES] [--memory-viz]

Checks the fields that memory_viz (torch/utils/viz/MemoryViz.js) and torch.cuda._memory_viz read, that the trace
replays (every free follows an alloc of the same block or frees one allocated before recording, segments hold their
blocks), and, with --step-peak, that the live bytes over the measured step peak exactly that far above where the
recording began. With --memory-viz, also runs torch.cuda._memory_viz's own readers on it. Exits 1 with the reason.
"""
import argparse
import pickle
import sys

ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
           "segment_unmap", "snapshot", "oom"}


def fail(message):
    print(f"check_memory_snapshot: {message}", file=sys.stderr)
    sys.exit(1)


def need(d, key, kind, where):
    if not isinstance(d, dict) or key not in d:
        fail(f"{where}: no '{key}'")
    if not isinstance(d[key], kind) or (kind is int and isinstance(d[key], bool)):
        fail(f"{where}.{key}: expected {kind.__name__}, got {type(d[key]).__name__}")
    return d[key]


def check_frames(frames, where):
    for i, f in enumerate(frames):
        need(f, "name", str, f"{where}.frames[{i}]")
        need(f, "filename", str, f"{where}.frames[{i}]")
        need(f, "line", int, f"{where}.frames[{i}]")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("snapshot")
    parser.add_argument("--step-peak", type=int)
    parser.add_argument("--memory-viz", action="store_true")
    args = parser.parse_args()
    with open(args.snapshot, "rb") as f:
        data = pickle.load(f)  # plain pickle: no torch needed to read it
    if not isinstance(data, dict):
        fail(f"top level: expected a dict, got {type(data).__name__}")
    segments = need(data, "segments", list, "snapshot")
    traces = need(data, "device_traces", list, "snapshot")
    need(data, "allocator_settings", dict, "snapshot")
    if not traces or not isinstance(traces[0], list):
        fail("device_traces: expected one list per device")

    live_at_end = 0
    for i, seg in enumerate(segments):
        where = f"segments[{i}]"
        device = need(seg, "device", int, where)
        address = need(seg, "address", int, where)
        total = need(seg, "total_size", int, where)
        need(seg, "stream", int, where)
        need(seg, "segment_type", str, where)
        if device >= len(traces):
            fail(f"{where}.device: {device}, but there are {len(traces)} device traces")
        offset = 0
        for j, block in enumerate(need(seg, "blocks", list, where)):
            bw = f"{where}.blocks[{j}]"
            size = need(block, "size", int, bw)
            requested = need(block, "requested_size", int, bw)
            state = need(block, "state", str, bw)
            if state not in ("active_allocated", "active_pending_free", "inactive"):
                fail(f"{bw}.state: '{state}'")
            if "address" in block and block["address"] != address + offset:
                fail(f"{bw}.address: {block['address']}, expected {address + offset} (blocks tile their segment)")
            check_frames(need(block, "frames", list, bw), bw)
            if requested > size:
                fail(f"{bw}: requested_size {requested} > size {size}")
            if state == "active_allocated":
                live_at_end += requested
            offset += size
        if offset != total:
            fail(f"{where}: blocks add up to {offset} bytes, total_size is {total}")

    events = traces[0]
    allocated = {}  # addr -> size, for blocks allocated while recording
    requested = set()
    total_alloc = total_free = 0
    for i, e in enumerate(events):
        where = f"device_traces[0][{i}]"
        action = need(e, "action", str, where)
        if action not in ACTIONS:
            fail(f"{where}.action: '{action}'")
        if action == "oom":
            continue
        addr = need(e, "addr", int, where)
        size = need(e, "size", int, where)
        need(e, "stream", int, where)
        need(e, "time_us", int, where)
        check_frames(need(e, "frames", list, where), where)
        if action == "alloc":
            if addr in allocated:
                fail(f"{where}: alloc of {addr:#x}, which is live")
            allocated[addr] = size
            total_alloc += size
        elif action == "free_requested":
            if addr in allocated and allocated[addr] != size:
                fail(f"{where}: free of {addr:#x} with size {size}, allocated with {allocated[addr]}")
            requested.add(addr)
        elif action == "free_completed":
            if addr not in requested:
                fail(f"{where}: free_completed of {addr:#x} without free_requested (memory_viz pairs them)")
            requested.discard(addr)
            allocated.pop(addr, None)
            total_free += size
    live_at_start = live_at_end - total_alloc + total_free
    if live_at_start < 0:
        fail(f"the trace frees more than was live: {live_at_start} bytes at the start")

    if args.step_peak is not None:
        # Live bytes after each event, then their highest from the measured step's first event on.
        live = live_at_start
        peak = None
        for e in events:
            if e["action"] == "alloc":
                live += e["size"]
            elif e["action"] == "free_completed":
                live -= e["size"]
            else:
                continue
            outer = e["frames"][-1]["name"] if e["frames"] else ""
            if peak is None and outer.startswith("measured step"):
                peak = live - (e["size"] if e["action"] == "alloc" else -e["size"])
            if peak is not None:
                peak = max(peak, live)
        if peak is None:
            fail("no event of the measured step")
        if peak - live_at_start != args.step_peak:
            fail(f"the measured step peaks {peak - live_at_start} bytes above the start; step_peak is {args.step_peak}")

    if args.memory_viz:
        from torch.cuda import _memory_viz as mv  # PyTorch's own readers of these files
        mv.segsum(data)
        mv.trace(data)
        for html in (mv.trace_plot(data), mv.segment_plot(data)):
            if "snapshot.pickle" not in html:
                fail("torch.cuda._memory_viz did not embed the snapshot")
    print(f"ok: {len(segments)} segments, {len(events)} trace entries, {live_at_end} bytes live at the end, "
          f"{live_at_start} at the start")


if __name__ == "__main__":
    main()
