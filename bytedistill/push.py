"""``bytedistill push``: the command line over :func:`students.release.push.plan_push` and
:func:`students.release.push.upload`."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from configs.ranges import NON_NEGATIVE, POSITIVE
from students.release.push import COMMIT_MESSAGE, RETRIES, TIMEOUT_S


@dataclass
class PushConfig:
    folder: str = field(metadata={"help": "exported model folder", "positional": True})
    repo_id: str = field(metadata={"help": "Hub repo id, e.g. your-name/byte-student", "positional": True})
    private: bool = field(default=False, metadata={"help": "create the repo as private"})
    revision: str | None = field(
        default=None, metadata={"help": "branch to push to (created if missing; default main)"}
    )
    commit_message: str = field(default=COMMIT_MESSAGE, metadata={"help": "commit message"})
    endpoint: str | None = field(
        default=None,
        metadata={
            "help": "Hub endpoint URL (default: HF_ENDPOINT or https://huggingface.co); the Hugging Face token goes "
            "only to those, another server gets the token in BYTEDISTILL_ENDPOINT_TOKEN"
        },
    )
    timeout: float = field(
        default=TIMEOUT_S,
        metadata={"help": "seconds to wait for the Hub to connect, and for each read or write", "range": POSITIVE},
    )
    retries: int = field(
        default=RETRIES,
        metadata={
            "help": "tries after the first of each Hub call (network error, timeout, 429, 5xx)",
            "range": NON_NEGATIVE,
        },
    )
    dry_run: bool = field(
        default=False,
        metadata={
            "help": "make push's checks (no tensor is loaded; a missing token is reported), list the files, upload nothing"
        },
    )


def push(config: PushConfig) -> int:
    """Upload an exported student folder to the Hugging Face Hub (only the files export wrote)."""
    from students.release.push import check_network_options, plan_push, upload

    check_network_options(config.timeout, config.retries)
    with plan_push(Path(config.folder), config.repo_id, config.endpoint, need_token=not config.dry_run) as plan:
        if plan.left_out:
            print(
                f"warning: not uploading {len(plan.left_out)} file(s) export did not write: {', '.join(plan.left_out)}",
                file=sys.stderr,
            )
        revision = config.revision or "main"
        if config.dry_run:
            for f in plan.files:
                print(f"{f.size:>14,}  {f.path}")
            print(f"{sum(f.size for f in plan.files):>14,}  total, {len(plan.files)} files")
            print(
                f"dry run: nothing was uploaded; push would send these files to {config.repo_id}@{revision} "
                f"at {plan.target.endpoint}, "
                + (plan.target.token_note if plan.target.token else f"but push would refuse: {plan.target.token_note}")
            )
            return 0
        url = upload(
            plan,
            private=config.private,
            revision=config.revision,
            commit_message=config.commit_message,
            timeout=config.timeout,
            retries=config.retries,
        )
        print(f"pushed {plan.folder} to {url} ({len(plan.files)} files)")
        return 0
