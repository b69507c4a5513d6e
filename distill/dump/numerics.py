"""How the teacher computes (its device, dtype and, on a CPU, torch's intra-op thread count), recorded
in the store's manifest (``teacher_numerics``) and matched by a resume.

A CPU's float kernels split their sums by thread, so the same forward with another thread count
rounds differently in the last bits; a stored code sitting on a quantisation boundary then flips, and
a resumed store's bytes differ from an uninterrupted run's. The command line picks the thread count
by the machine's load (``common/threads.py``), so a resume that chooses none itself takes the
count the store was written with; one given another count (``--threads``, ``OMP_NUM_THREADS``) or a
teacher on another device or dtype is told, in one line, that its rows may round differently.
"""

from __future__ import annotations

NUMERICS_FIELD = "teacher_numerics"


def teacher_numerics(device, dtype) -> dict:
    """What decides how the teacher's floats round: its device kind, its dtype and, on a CPU, torch's
    thread count now."""
    import torch

    numerics = {"device": device.type, "dtype": str(dtype).removeprefix("torch.")}
    return numerics | ({"cpu_threads": torch.get_num_threads()} if device.type == "cpu" else {})


def recorded_numerics(manifest: dict | None) -> dict | None:
    """The numerics a store's ``manifest`` records (``None``: no store, or one written before they were)."""
    recorded = None if manifest is None else manifest.get(NUMERICS_FIELD)
    return recorded if isinstance(recorded, dict) else None


def match_recorded_numerics(
    manifest: dict | None, device, dtype, requested_threads: int | None
) -> tuple[int | None, str | None]:
    """Before the teacher's first forward: take the CPU thread count the resumed store's ``manifest``
    records when the user chose none. Returns the count taken (or ``None``) and a note when the teacher still computes otherwise
    than the store was written (or ``None``)."""
    import torch

    from common.threads import threads_chosen

    recorded = recorded_numerics(manifest)
    now = teacher_numerics(device, dtype)
    if recorded is None or now == recorded:
        return None, None
    threads = recorded.get("cpu_threads")
    same_kind = all(recorded.get(k) == now[k] for k in ("device", "dtype"))
    if same_kind and isinstance(threads, int) and threads > 0 and not threads_chosen(requested_threads):
        torch.set_num_threads(threads)
        return threads, None
    differ = ", ".join(
        f"{k} {recorded.get(k)} (now {now.get(k)})" for k in sorted(now) if recorded.get(k) != now.get(k)
    )
    return None, (
        f"note: the store was written with the teacher's {differ}; the rows this run adds may round "
        "differently from an uninterrupted run's"
    )
