"""Describe the resolved GPU environments: which library directories each wheel installs.

For each GPU requirements file (one file = one environment), pip resolves the set for
Linux x86_64 / CPython 3.11 from package metadata only (``pip install --dry-run --report``,
no wheel is downloaded). The report names every wheel's URL; this script then reads each
wheel's ``*.dist-info/RECORD`` with HTTP Range requests (the zip's end record, its central
directory, then RECORD's own bytes: a few KiB to a few MiB per wheel, never the wheel) and
writes, per environment, each distribution's name, version, the shared libraries it
installs and the sorted directories holding them (``nvidia/cudnn/lib``, ``torch/lib``...).

``tests/unit/scripts/test_gpu_stack.py`` reads the committed description offline and fails when two
distributions of one environment install the same library into one directory (two cuDNN or
two NCCL builds overwriting each other's files). Several wheels of one toolkit sharing a
folder, each with its own libraries (CUDA 13's ``nvidia/cu13/lib``), is not a collision.

Regenerate after changing requirements-gpu*.txt (needs https://pypi.org and
https://download.pytorch.org)::

    python scripts/gpu_stack.py                      # writes tests/data/gpu_stack.json

On a machine that reaches only PyPI (as the one that wrote the committed file), add
``--find-links tf=DIR`` with DIR holding torch's CPU wheel (see the end of this text).

The description of the pre-split requirements-gpu.txt (torch==2.13.0 together with
tensorflow[and-cuda]==2.21.0 in one environment) was written with::

    printf 'torch==2.13.0\\ntensorflow[and-cuda]==2.21.0\\n' > /tmp/legacy.txt
    python scripts/gpu_stack.py --requirements main=/tmp/legacy.txt \\
        --output tests/data/gpu_stack_legacy.json

requirements-gpu-tf.txt takes its CPU-only torch from download.pytorch.org/whl/cpu. Where
that index cannot be reached, pass a folder holding the same wheel file for that environment
only, ``--find-links tf=DIR`` (its RECORD is then read from the local file). Never for the
main environment: pip prefers ``2.13.0+cpu`` to ``2.13.0`` for the pin ``torch==2.13.0``.
"""

import argparse
import concurrent.futures
import json
import os
import re
import shlex
import struct
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_ENVIRONMENTS = ("main=requirements-gpu.txt", "tf=requirements-gpu-tf.txt")
DEFAULT_OUTPUT = "tests/data/gpu_stack.json"
INDEX_URL = "https://pypi.org/simple"
# the tags pip accepts on a Linux x86_64 node with glibc 2.28 (pip matches an explicit
# --platform only exactly: TF 2.21 is manylinux_2_27, torch 2.13 manylinux_2_28, the
# nvidia-* wheels manylinux_2_17/2_18/2014)
GLIBC_MINOR = 28
PLATFORMS = tuple(f"manylinux_2_{minor}_x86_64" for minor in range(GLIBC_MINOR, 4, -1)) + (
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64")
PYTHON_VERSION = "3.11"
SHARED_LIBRARY = re.compile(r"\.so(\.\d+)*$")
TIMEOUT_S = 60
SMALL_WHEEL_BYTES = 1 << 20


class StackError(RuntimeError):
    """A failure this script explains in one line (exit status 2)."""


# ------------------------------------------------------------------ reading a remote zip
def http_range_reader(url):
    """Return ``read(start, length)`` for a URL, plus its size; ``start < 0`` reads the end."""
    if url.startswith("file:"):
        path = urllib.request.url2pathname(urllib.parse.urlparse(url).path)
        size = os.path.getsize(path)

        def read_file(start, length):
            with open(path, "rb") as handle:
                handle.seek(max(start if start >= 0 else size + start, 0))
                return handle.read(length)

        return read_file, size

    def read_http(start, length):
        spec = f"bytes={start}" if start < 0 else f"bytes={start}-{start + length - 1}"
        request = urllib.request.Request(url, headers={"Range": spec})
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            length_header = int(response.headers.get("Content-Length") or -1)
            if response.status == 200 and 0 <= length_header <= SMALL_WHEEL_BYTES:
                body = response.read()  # a small wheel: the server sent it whole
                read_http.size = len(body)
                return body[start:] if start < 0 else body[start:start + length]
            if response.status != 206:
                raise StackError(f"{url}: the server ignored the Range request "
                                 f"(HTTP {response.status}); refusing to download the wheel")
            total = response.headers.get("Content-Range", "").rpartition("/")[2]
            read_http.size = int(total) if total.isdigit() else None
            return response.read()

    return read_http, None


def central_directory(read, size=None):
    """Parse a zip's central directory from its tail: {name: (method, csize, local_offset)}."""
    tail = read(-(65536 + 22), 65536 + 22)
    size = size if size is not None else getattr(read, "size", None) or len(tail)
    tail_start = size - len(tail)
    end = tail.rfind(b"PK\x05\x06")
    if end < 0:
        raise StackError("no zip end-of-central-directory record: not a wheel?")
    count, cd_size, cd_offset = struct.unpack("<HII", tail[end + 10:end + 20])
    if 0xFFFFFFFF in (cd_size, cd_offset) or count == 0xFFFF:
        locator = tail.rfind(b"PK\x06\x07", 0, end)
        if locator < 0:
            raise StackError("zip64 end record announced but its locator is missing")
        (zip64_offset,) = struct.unpack("<Q", tail[locator + 8:locator + 16])
        if zip64_offset >= tail_start:
            record = tail[zip64_offset - tail_start:]
        else:
            record = read(zip64_offset, 56)
        count, cd_size, cd_offset = struct.unpack("<QQQ", record[32:56])
    if cd_offset >= tail_start:
        data = tail[cd_offset - tail_start:cd_offset - tail_start + cd_size]
    else:
        data = read(cd_offset, cd_size)
    entries, pos = {}, 0
    while pos + 46 <= len(data) and data[pos:pos + 4] == b"PK\x01\x02":
        (method, csize, usize, name_len, extra_len, comment_len,
         local) = struct.unpack("<H8xIIHHH8xI", data[pos + 10:pos + 46])
        name = data[pos + 46:pos + 46 + name_len].decode("utf-8")
        extra = data[pos + 46 + name_len:pos + 46 + name_len + extra_len]
        csize, local = _zip64_sizes(extra, usize, csize, local)
        entries[name] = (method, csize, local)
        pos += 46 + name_len + extra_len + comment_len
    if len(entries) != count:
        raise StackError(f"central directory lists {len(entries)} entries, expected {count}")
    return entries


def _zip64_sizes(extra, usize, csize, local):
    """Apply the zip64 extra field (id 1), which replaces the fields set to 0xFFFFFFFF."""
    pos = 0
    while pos + 4 <= len(extra):
        field_id, field_len = struct.unpack("<HH", extra[pos:pos + 4])
        if field_id == 1:
            values = iter(struct.unpack(f"<{field_len // 8}Q", extra[pos + 4:pos + 4
                                                                     + field_len // 8 * 8]))
            if usize == 0xFFFFFFFF:
                next(values)
            if csize == 0xFFFFFFFF:
                csize = next(values)
            if local == 0xFFFFFFFF:
                local = next(values)
        pos += 4 + field_len
    return csize, local


def read_member(read, entry):
    """The uncompressed bytes of one zip member (stored or deflated)."""
    method, csize, local = entry
    header = read(local, 30)
    if header[:4] != b"PK\x03\x04":
        raise StackError("bad local file header")
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    raw = read(local + 30 + name_len + extra_len, csize) if csize else b""
    if method == 0:
        return raw
    if method == 8:
        return zlib.decompressobj(-15).decompress(raw)
    raise StackError(f"unsupported zip compression method {method}")


def wheel_record(url):
    """The RECORD file of the wheel at ``url`` as a list of installed paths."""
    read, size = http_range_reader(url)
    entries = central_directory(read, size)
    records = [name for name in entries
               if re.fullmatch(r"[^/]+\.dist-info/RECORD", name)]
    if len(records) != 1:
        raise StackError(f"{url}: expected one *.dist-info/RECORD, found {records}")
    text = read_member(read, entries[records[0]]).decode("utf-8")
    return [installed_path(line.rsplit(",", 2)[0]) for line in text.splitlines() if line]


def installed_path(path):
    """Where a RECORD path lands in site-packages (``x.data/purelib/a`` -> ``a``)."""
    match = re.fullmatch(r"[^/]+\.data/(?:purelib|platlib)/(.+)", path)
    return match.group(1) if match else path


def library_layout(paths):
    """(sorted shared-library paths, sorted directories holding them) of installed paths."""
    libraries = sorted(p for p in paths if SHARED_LIBRARY.search(p.rsplit("/", 1)[-1])
                       and ".data/" not in p)
    return libraries, sorted({p.rsplit("/", 1)[0] if "/" in p else "." for p in libraries})


def library_stem(path):
    """``nvidia/cudnn/lib/libcudnn_ops.so.9`` -> ``libcudnn_ops`` (any version suffix)."""
    return path.rsplit("/", 1)[-1].split(".so")[0]


def shared_library_dirs(distributions):
    """{directory: sorted distribution names} for directories holding libraries of two or more.

    Args:
        distributions: the ``distributions`` list of one environment in the description.
    """
    owners = {}
    for dist in distributions:
        for directory in dist["library_dirs"]:
            owners.setdefault(directory, set()).add(dist["name"])
    return {d: sorted(names) for d, names in sorted(owners.items()) if len(names) > 1}


def library_collisions(distributions):
    """Directories where two distributions install the same library (two builds, one wins).

    A directory shared by several wheels of one toolkit, each with its own libraries (CUDA
    13's ``nvidia/cu13/lib``), is not a collision; two wheels that both install
    ``libcudnn_ops.so*`` into ``nvidia/cudnn/lib`` are: the one installed last overwrites the
    other's files and the survivors mix two builds.

    Returns:
        {directory: {library stem: sorted distribution names}}, empty when there is none.
    """
    stems = {}
    for dist in distributions:
        for library in dist["libraries"]:
            directory = library.rsplit("/", 1)[0] if "/" in library else "."
            key = (directory, library_stem(library))
            stems.setdefault(key, set()).add(dist["name"])
    collisions = {}
    for (directory, stem), names in sorted(stems.items()):
        if len(names) > 1:
            collisions.setdefault(directory, {})[stem] = sorted(names)
    return collisions


# ------------------------------------------------------------------ resolving with pip
def requirement_lines(path):
    """The requirement lines of a file (comments, blanks and pip options dropped)."""
    lines = (line.split("#")[0].strip() for line in Path(path).read_text().splitlines())
    return sorted(line for line in lines if line and not line.startswith("-"))


def check_index(index_url):
    """Fail with a clear message when the package index cannot be reached."""
    url = index_url.rstrip("/") + "/pip/"
    try:
        with urllib.request.urlopen(url, timeout=20) as response:
            response.read(1)
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise StackError(
            f"cannot reach the package index {index_url} ({reason}). This script reads wheel "
            "metadata from PyPI: run it on a machine with internet access, or pass "
            "--index-url to a reachable mirror."
        ) from None


def resolve(requirements, index_url, find_links=()):
    """pip's dry-run report (a dict) for one requirements file on a Linux GPU node."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
                   "--quiet", "--report", str(report), "--only-binary=:all:",
                   "--python-version", PYTHON_VERSION, "--implementation", "cp",
                   "--index-url", index_url, "--timeout", "30", "--retries", "1"]
        for platform in PLATFORMS:
            command += ["--platform", platform]
        for folder in find_links:
            command += ["--find-links", str(folder)]
        command += ["-r", str(requirements)]
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            lines = [line for line in (done.stderr + done.stdout).splitlines()
                     if line.strip() and "Could not fetch URL" not in line]
            raise StackError(f"pip could not resolve {requirements}:\n  "
                             + "\n  ".join(lines[-15:]) + f"\n(command: {shlex.join(command)})")
        return json.loads(report.read_text())


def describe_environment(requirements, index_url, find_links=(), workers=8):
    """{"requirements": [...], "distributions": [...]} for one requirements file."""
    report = resolve(requirements, index_url, find_links)
    installs = sorted(report["install"], key=lambda item: item["metadata"]["name"].lower())

    def one(item):
        url = item["download_info"]["url"]
        libraries, directories = library_layout(wheel_record(url))
        return {
            "name": item["metadata"]["name"],
            "version": item["metadata"]["version"],
            "wheel": urllib.parse.unquote(url.rsplit("/", 1)[-1]),
            "library_dirs": directories,
            "libraries": libraries,
        }

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        distributions = list(pool.map(one, installs))
    return {"requirements": requirement_lines(requirements), "distributions": distributions}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Resolve each GPU requirements file for Linux x86_64 / CPython "
                    f"{PYTHON_VERSION} (metadata only), read every wheel's RECORD with HTTP "
                    "Range requests, and write which library directories each distribution "
                    "installs (needs https://pypi.org).",
        epilog="Example: python scripts/gpu_stack.py --requirements main=/tmp/legacy.txt "
               "--output tests/data/gpu_stack_legacy.json",
    )
    parser.add_argument(
        "--requirements", action="append", metavar="[NAME=]FILE",
        help="one environment per file, repeatable (default: "
             + " ".join(DEFAULT_ENVIRONMENTS) + "); NAME defaults to the file's stem")
    parser.add_argument("--output", default=DEFAULT_OUTPUT,
                        help=f"JSON file to write (default: {DEFAULT_OUTPUT})")
    parser.add_argument("--index-url", default=INDEX_URL,
                        help=f"package index (default: {INDEX_URL})")
    parser.add_argument("--find-links", action="append", default=[], metavar="NAME=DIR",
                        help="extra folder of wheels for environment NAME only, standing in "
                             "for an index this machine cannot reach (e.g. tf=/opt/wheels for "
                             "torch's CPU wheel); repeatable")
    args = parser.parse_args(argv)
    environments = {}
    for spec in args.requirements or DEFAULT_ENVIRONMENTS:
        name, _, path = spec.rpartition("=")
        path = Path(path) if Path(path).is_absolute() else Path.cwd() / path
        if not path.is_file() and (ROOT / spec.rpartition("=")[2]).is_file():
            path = ROOT / spec.rpartition("=")[2]
        if not path.is_file():
            parser.error(f"--requirements: no such file: {path}")
        environments[name or path.stem] = path
    args.environments = environments
    args.find_links_for = {}
    for spec in args.find_links:
        name, sep, folder = spec.partition("=")
        if not sep or name not in environments:
            parser.error(f"--find-links: expected NAME=DIR with NAME one of "
                         f"{sorted(environments)}, got {spec!r}")
        if not Path(folder).is_dir():
            parser.error(f"--find-links: no such folder: {folder}")
        args.find_links_for.setdefault(name, []).append(Path(folder).resolve())
    return args


def main(argv=None):
    args = parse_args(argv)
    try:
        check_index(args.index_url)
        description = {
            "generated_by": shlex.join(["python", "scripts/gpu_stack.py", *(
                sys.argv[1:] if argv is None else argv)]),
            "platform": {"python": PYTHON_VERSION, "tags": list(PLATFORMS)},
            "environments": {
                name: describe_environment(path, args.index_url,
                                           args.find_links_for.get(name, ()))
                for name, path in args.environments.items()
            },
        }
    except StackError as error:
        print(f"gpu_stack.py: {error}", file=sys.stderr)
        return 2
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(description, indent=1, sort_keys=True) + "\n")
    for name, env in description["environments"].items():
        print(f"{name}: {len(env['distributions'])} distributions "
              f"({', '.join(env['requirements'])})")
        for directory, stems in library_collisions(env["distributions"]).items():
            owners = sorted({n for names in stems.values() for n in names})
            print(f"  COLLISION {directory}: {', '.join(owners)} install "
                  f"{', '.join(sorted(stems))}")
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
