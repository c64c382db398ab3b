"""Owner-only files for the enclave's private data (issue 26).

Private data folders are ``0700`` and their files ``0600``, whatever the process umask:
the registered rows (the worker's data folder), the releases (``RELEASE_DIR``), the embedded mode's
logs (``HOME/logs``) and its SQLite ledger. Everything that writes there creates its
folders with :func:`make_private_dir` and its files with :func:`open_private_file` (or, for
a temporary file, ``tempfile.mkstemp``, which is ``0600`` by itself, plus an explicit
``fchmod``): ``os.makedirs``'s and ``os.open``'s modes are masked by the umask, so each
new path is ``chmod``-ed explicitly as well.

At start-up the API (:func:`service.app.create_app`) and the worker
(``worker/celery_app.py``) call :func:`warn_private_permissions`: one warning per folder
or file wider than ``0700``/``0600`` (never its contents). Nothing is changed or refused;
``chmod -R go-rwx <folder>`` is the fix.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from sqlalchemy.engine import make_url

from service.config import Settings

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
# The SQLite ledger's side files (SQLite gives them the database file's mode).
SQLITE_SIDE_SUFFIXES = ("-wal", "-shm", "-journal")
# At most this many warnings at start-up; then one line counting the rest.
MAX_WARNINGS = 100

log = logging.getLogger("enclave.permissions")


def make_private_dir(path: Path) -> Path:
    """``path`` as a folder, creating it and any missing parents ``0700`` (chmod-ed, so
    the umask does not matter). Folders that already exist are left as they are (the
    start-up check reports them)."""
    missing: list[Path] = []
    p = path
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, PRIVATE_DIR_MODE)
        except FileExistsError:
            continue  # made by another process meanwhile
        os.chmod(folder, PRIVATE_DIR_MODE)
    if not path.is_dir():
        raise NotADirectoryError(f"{path} is not a folder")
    return path


def open_private_file(path: Path, flags: int = os.O_WRONLY | os.O_CREAT | os.O_TRUNC) -> int:
    """A file descriptor on ``path`` opened with ``flags`` (it must create or write),
    the file ``0600`` whatever the umask, and also when it already existed."""
    fd = os.open(path, flags, PRIVATE_FILE_MODE)
    try:
        os.fchmod(fd, PRIVATE_FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def sqlite_file(url: str) -> Path | None:
    """The database file of a ``sqlite`` SQLAlchemy URL; None for anything else (another
    database, an in-memory or URI-style SQLite)."""
    try:
        parsed = make_url(url)
    except Exception:
        return None
    database = parsed.database
    if not parsed.drivername.startswith("sqlite") or not database:
        return None
    if database == ":memory:" or database.startswith("file:") or parsed.query.get("uri"):
        return None
    return Path(database)


def create_private_sqlite(url: str) -> None:
    """Create a SQLite ledger's missing file empty and ``0600`` (an empty file is a valid
    database), so SQLite does not make it with the umask's mode; its ``-wal`` and ``-shm``
    files take the database file's mode. Nothing happens when the file exists, the URL is
    not a file-backed SQLite, or its folder does not exist (SQLite reports that)."""
    path = sqlite_file(url)
    if path is None or not path.parent.is_dir():
        return
    try:
        fd = open_private_file(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return
    os.close(fd)


def _mode_problem(path: Path, mode: int, *, folder: bool) -> str | None:
    allowed = PRIVATE_DIR_MODE if folder else PRIVATE_FILE_MODE
    bits = stat.S_IMODE(mode)
    if bits & ~allowed == 0:
        return None
    kind = "folder" if folder else "file"
    return (
        f"private {kind} {path} has mode {bits:04o}, wider than {allowed:04o}: "
        f"others may read it (fix: chmod {allowed:o} {path})"
    )


def _check_tree(root: Path) -> list[str]:
    """Problems of ``root`` (followed if a link) and of everything under it (links under
    it are neither followed nor checked: their own mode means nothing)."""
    try:
        st = root.stat()
    except FileNotFoundError:
        return []
    except OSError as exc:
        return [f"cannot check private path {root}: {exc.strerror or exc}"]
    if not stat.S_ISDIR(st.st_mode):
        problem = _mode_problem(root, st.st_mode, folder=False)
        return [problem] if problem else []
    problems: list[str] = []
    problem = _mode_problem(root, st.st_mode, folder=True)
    if problem:
        problems.append(problem)

    def unreadable(exc: OSError) -> None:
        problems.append(f"cannot check private folder {exc.filename}: {exc.strerror or exc}")

    for folder, dirs, files in os.walk(root, onerror=unreadable):
        dirs.sort()
        for name in [*dirs, *sorted(files)]:
            path = Path(folder) / name
            try:
                st = path.lstat()
            except FileNotFoundError:
                continue
            except OSError as exc:
                problems.append(f"cannot check private path {path}: {exc.strerror or exc}")
                continue
            if stat.S_ISLNK(st.st_mode):
                continue
            problem = _mode_problem(path, st.st_mode, folder=stat.S_ISDIR(st.st_mode))
            if problem:
                problems.append(problem)
    return problems


def check_private_permissions(
    folders: Iterable[Path], *, ledger_file: Path | None = None
) -> list[str]:
    """One line per private folder wider than ``0700`` or file wider than ``0600`` (or
    that cannot be checked), walking ``folders`` and looking at the SQLite ledger file
    with its side files. Paths that do not exist are skipped; nothing is read but modes."""
    files: list[Path] = []
    if ledger_file is not None:
        files = [ledger_file, *(Path(f"{ledger_file}{s}") for s in SQLITE_SIDE_SUFFIXES)]
    problems: list[str] = []
    seen: set[Path] = set()
    for path in [*folders, *files]:
        if path in seen:
            continue
        seen.add(path)
        problems.extend(_check_tree(path))
    return problems


def settings_permission_problems(
    settings: Settings, *, private_folders: Iterable[Path] = ()
) -> list[str]:
    """:func:`check_private_permissions` on the release folder, ``HOME/logs``, the SQLite
    ledger (embedded mode) and ``private_folders``: the worker adds its data folder, which
    the service never names (only the worker reads the private data volume)."""
    return check_private_permissions(
        [settings.resolved_release_dir, settings.home / "logs", *private_folders],
        ledger_file=sqlite_file(settings.resolved_database_url),
    )


def warn_private_permissions(
    settings: Settings,
    logger: logging.Logger = log,
    *,
    private_folders: Iterable[Path] = (),
) -> list[str]:
    """The start-up check: log one warning per problem (at most :data:`MAX_WARNINGS`,
    then one line with the count of the rest), never raise; returns the problems."""
    try:
        problems = settings_permission_problems(settings, private_folders=private_folders)
    except Exception as exc:  # the check must never stop a start-up
        logger.warning("could not check the private files' permissions: %s", exc)
        return []
    for problem in problems[:MAX_WARNINGS]:
        logger.warning("%s", problem)
    if len(problems) > MAX_WARNINGS:
        logger.warning(
            "%d more private paths are readable by others (fix: chmod -R go-rwx on the "
            "enclave's data, release and log folders)",
            len(problems) - MAX_WARNINGS,
        )
    return problems


__all__ = [
    "PRIVATE_DIR_MODE",
    "PRIVATE_FILE_MODE",
    "check_private_permissions",
    "create_private_sqlite",
    "make_private_dir",
    "open_private_file",
    "settings_permission_problems",
    "sqlite_file",
    "warn_private_permissions",
]
