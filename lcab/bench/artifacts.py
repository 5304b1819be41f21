"""What a cell leaves beside its records for people to look at: profiler traces, the mask.

Traces are taken in extra repetitions *after* the timed ones (whose timing the profiler would
skew), one Chrome-trace JSON per rank; see ``lcab/bench/README.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from lcab.cell import Cell
from lcab.cp.comm import traced_phases
from lcab.lazy import lazy_module
from lcab.masks import AttnMask
from lcab.records.artifacts import MASK_PICTURE, TRACES_DIR
from lcab.records.schema import RunRecord

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())


def trace_path(job_dir: str | Path, seqlen: int, pass_: str, rank: int) -> Path:
    """Where the trace of one (length, pass, rank) goes."""
    return Path(job_dir) / TRACES_DIR / f"S{seqlen}-{pass_}-rank{rank}.json"


def profile_pass(
    fn: Callable[[], object],
    *,
    label: str,
    reps: int,
    device: torch.device,
    path: Path,
    before_each: Callable[[], None] | None = None,
    barrier: Callable[[], None] | None = None,
) -> Path:
    """Run ``fn`` ``reps`` times under the profiler (hooks outside each range); write the trace."""
    from torch.profiler import ProfilerActivity, profile, record_function

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with traced_phases(), profile(activities=activities) as prof:
        for _ in range(reps):
            if before_each is not None:
                before_each()
            if barrier is not None:
                barrier()
            with record_function(label):
                fn()
            if cuda:
                torch.cuda.synchronize(device)
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    return path


def save_mask_picture_of(cell: Cell, mask: AttnMask, record: RunRecord) -> Path | None:
    """Draw ``mask`` into the job folder; a picture that fails is a reason, never a failure."""
    from lcab.masks.picture import save_mask_picture

    path = Path(cell.job.output_dir) / MASK_PICTURE.format(seqlen=mask.seqlen_q)
    try:
        return save_mask_picture(mask, path)
    except Exception as err:
        path.unlink(missing_ok=True)  # a full disk leaves part of a file: room for the records
        record.reasons.append(f"mask picture failed: {type(err).__name__}: {err}"[:240])
        return None
