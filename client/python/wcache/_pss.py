"""What a process's memory costs, read from /proc: its proportional set
size (PSS) and the share of it that maps one file.

PSS counts a page shared by N processes as 1/N in each, so the sum over a
set of processes is what they really cost together: the figure the
benchmark (tests/bench/bench_python.py) and the pre-fork example
(examples/prefork_pss.py) report for workers holding a model. Standard
library only, so the example can use it without torch.
"""
import os


def pss_kib(pid):
    """PSS of process pid in KiB, from /proc/PID/smaps_rollup."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1])
    raise RuntimeError(f"no Pss for {pid}")


def file_pss_kib(pid, path):
    """PSS in KiB of pid's mappings of the file path (by inode), from
    /proc/PID/smaps."""
    ino = os.stat(path).st_ino
    total, inside = 0, False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split(None, 5)
            if "-" in head[0] and len(head) >= 5 and ":" in head[3]:
                inside = len(head) == 6 and int(head[4]) == ino
            elif inside and line.startswith("Pss:"):
                total += int(line.split()[1])
    return total
