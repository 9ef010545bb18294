"""CPU seconds spent by a server's processes (Linux /proc), split by process, so a serving benchmark can say where
the time of two cores went: the HTTP front end, the engine, helpers. CPU time, unlike wall time, is little
changed by other load on the box."""
import os
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[str, int, float] | None:
    """(name, parent pid, user + system seconds) of a live process, or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
    return name, int(rest[1]), (int(rest[11]) + int(rest[12])) / TICK


def process_tree(root: int) -> dict[int, tuple[str, float]]:
    """pid -> (name, CPU seconds so far) of `root` and every live descendant."""
    stats = {int(p): s for p in os.listdir("/proc") if p.isdigit() and (s := _stat(int(p)))}
    tree, frontier = {}, [root]
    while frontier:
        pid = frontier.pop()
        if pid in stats and pid not in tree:
            tree[pid] = (stats[pid][0], stats[pid][2])
            frontier += [child for child, (_, parent, _) in stats.items() if parent == pid]
    return tree


def spent(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], root: int) -> str:
    """'front end 3.1 s, others 9.8 s (EngineCore 9.7 s)': the CPU seconds of the root process and of the rest
    between two `process_tree` readings (a process that ended in between is not counted)."""
    deltas = {pid: (name, seconds - before.get(pid, (name, 0.0))[1]) for pid, (name, seconds) in after.items()}
    front = deltas.pop(root, ("", 0.0))[1]
    by_name: dict[str, float] = {}
    for name, seconds in deltas.values():
        by_name[name] = by_name.get(name, 0.0) + seconds
    detail = ", ".join(f"{name} {s:.1f} s" for name, s in sorted(by_name.items(), key=lambda x: -x[1]) if s >= 0.05)
    return f"front end {front:.1f} s, others {sum(by_name.values()):.1f} s ({detail or 'none'})"
