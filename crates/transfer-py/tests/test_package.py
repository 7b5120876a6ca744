"""The installed package: stubs for every public call, typed marker, abi3."""

from __future__ import annotations

import ast
from pathlib import Path

import transfer
from transfer import _native


def stub_members() -> dict[str, set[str]]:
    pkg = Path(transfer.__file__).parent
    tree = ast.parse((pkg / "_native.pyi").read_text())
    return {
        node.name: {m.name for m in node.body if isinstance(m, ast.FunctionDef)}
        for node in tree.body
        if isinstance(node, ast.ClassDef)
    }


def test_typed_marker_and_stubs_ship() -> None:
    pkg = Path(transfer.__file__).parent
    assert (pkg / "py.typed").is_file()
    assert (pkg / "_native.pyi").is_file()
    assert Path(_native.__file__).name.endswith(".abi3.so")


def test_every_public_member_has_a_stub() -> None:
    stubs = stub_members()
    for cls in (transfer.Engine, transfer.Region, transfer.Peer,
                transfer.RemoteRegion, transfer.Transfer):
        public = {n for n in dir(cls) if not n.startswith("_")} | {
            n for n in ("__await__", "__enter__", "__exit__", "__len__") if hasattr(cls, n)
        }
        missing = public - stubs[cls.__name__]
        assert not missing, f"{cls.__name__}: no stub for {sorted(missing)}"


def test_public_names() -> None:
    for name in transfer.__all__:
        assert hasattr(transfer, name)
