"""Files generated from Python definitions (the CRDs, the chart's generated parts): write them, or check
that the committed copies are current."""
import logging
from pathlib import Path

log = logging.getLogger(__name__)


def stale_files(files: dict[str, str], directory: Path) -> list[str]:
    """Names (relative to `directory`) of the files that are missing or differ on disk."""
    return [name for name, text in files.items()
            if not (directory / name).exists() or (directory / name).read_text() != text]


def write_or_check(files: dict[str, str], directory: Path, check: bool, command: str) -> int:
    """Writes every file under `directory`; with `check`, writes nothing and returns 1 if any is stale."""
    if check:
        stale = stale_files(files, directory)
        for name in stale:
            log.error("stale: %s (run %s)", directory / name, command)
        return 1 if stale else 0
    for name, text in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        log.info("wrote %s", path)
    return 0
