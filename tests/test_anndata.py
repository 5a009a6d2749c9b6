"""AnnData in and out, against files the real anndata package wrote (tests/data/anndata,
made by its make_fixtures.py): ``.h5ad``, AnnData-Zarr in Zarr formats 2 and 3, their ``X``
(dense), ``layers`` (CSR and CSC) and ``obsm`` read equal to the ground truth with the cells'
names; the estimators and ``dr-dask embed`` on them; ``write_obsm`` back into each.

anndata itself is not installed beside this package (it pins pandas < 3). Where the
fixtures' virtualenv exists (``.venv-anndata`` at the repository root, or the interpreter
named by ``DR_DASK_ANNDATA_PYTHON``), the last tests run real AnnData objects (in memory and
backed) through the estimators, and anndata reads what ``write_obsm`` wrote, in a subprocess
of that interpreter; elsewhere (CI) they are skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import site
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import zarr
from click.testing import CliRunner

from dr_dask import IKD, Isomap
from dr_dask.cli import main
from dr_dask.io.anndata import write_obsm
from dr_dask.io.inputs import InputError, open_dataset, parse_source
from dr_dask.io.storage import Location
from dr_dask.runs.group import open_run

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "anndata"
STORES = ("cells.h5ad", "cells.zarr", "cells_v3.zarr")
OBS_NAMES = np.load(DATA / "obs_names.npy")
COUNTS = np.load(DATA / "counts.npy")
TRUTH = {"X": np.load(DATA / "X.npy"), "layers/counts": COUNTS, "layers/counts_csc": COUNTS,
         "obsm/X_pca": np.load(DATA / "X_pca.npy")}
ANNDATA_PYTHON = Path(os.environ.get("DR_DASK_ANNDATA_PYTHON",
                                     ROOT / ".venv-anndata" / "bin" / "python"))
needs_anndata = pytest.mark.skipif(
    not ANNDATA_PYTHON.exists(),
    reason=f"no anndata interpreter at {ANNDATA_PYTHON} (tests/data/anndata/make_fixtures.py "
    "says how to make it; DR_DASK_ANNDATA_PYTHON names another)")


def _copy(store: str, tmp_path: Path) -> str:
    """A copy of a fixture store to write into (the fixtures stay as anndata wrote them)."""
    src, dst = DATA / store, tmp_path / store
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        shutil.copy(src, dst)
    return str(dst)


def _digest(path: str | Path) -> str:
    """SHA-1 of every file under ``path`` (names and bytes): the store is unchanged or not."""
    path = Path(path)
    h = hashlib.sha1()
    for f in sorted(p for p in ([path] if path.is_file() else path.rglob("*")) if p.is_file()):
        h.update(str(f.relative_to(path.parent)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


@pytest.mark.parametrize("element", [None, *TRUTH])
@pytest.mark.parametrize("store", STORES)
def test_elements_read_equal_anndata_s_values_by_row_blocks(store, element, dr_config):
    """Every element of every kind of store reads equal to what anndata was given, in several
    row blocks, each row named by its cell."""
    dr_config({"input.chunk-bytes": 1})  # the fewest rows a block holds (256): 2 blocks
    source = f"{DATA / store}:{element}" if element else str(DATA / store)
    inp = open_dataset(source)
    # a Zarr array's blocks are whole chunks of its own: anndata wrote X in chunks of 100
    # rows, obsm in one
    one_chunk = store.endswith(".zarr") and element == "obsm/X_pca"
    assert inp.data.numblocks[0] == (1 if one_chunk else 2)
    np.testing.assert_array_equal(inp.data.compute(), TRUTH[element or "X"])
    assert inp.data.dtype == TRUTH[element or "X"].dtype
    np.testing.assert_array_equal(inp.sample_ids, OBS_NAMES)
    assert inp.identity["variable"] == (element or "X")
    assert inp.identity["path"] == str(DATA / store)
    assert len(inp.identify()["fingerprint"]) == 16


def test_store_and_element_syntax():
    """``STORE:layers/NAME`` splits at its last ':' while a URL's scheme stays whole."""
    assert parse_source("cells.zarr:obsm/X_pca") == ("cells.zarr", "obsm/X_pca")
    assert parse_source("/data/cells.h5ad:layers/counts") == ("/data/cells.h5ad", "layers/counts")
    assert parse_source("memory://absent/cells.zarr") == ("memory://absent/cells.zarr", None)


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize(("element", "message"), [
    ("obsm/X_umap", "has no element 'obsm/X_umap'; it has X, layers/counts, layers/counts_csc, "
                    "obsm/X_pca, obsm/cell_meta"),
    ("layers/raw", "has no element 'layers/raw'; it has X, layers/counts"),
    ("obsm/cell_meta", "obsm/cell_meta is not an array (its encoding-type is 'dataframe'); the "
                       "arrays of this AnnData: X, layers/counts, layers/counts_csc, obsm/X_pca"),
    ("var/gene_ids", "'var/gene_ids' is not an element of an AnnData; name X, layers/NAME, "
                     "obsm/NAME"),
])
def test_a_bad_element_is_named_with_what_the_store_has(store, element, message):
    with pytest.raises(InputError) as err:
        open_dataset(f"{DATA / store}:{element}")
    assert message in str(err.value)


def test_a_missing_chunk_of_a_sparse_layer_is_named(tmp_path):
    """A CSR layer's chunk deleted from the store: refused at opening, naming the array and the
    chunk key (it would read as zeros)."""
    path = _copy("cells_v3.zarr", tmp_path)
    (Path(path) / "layers" / "counts" / "indices" / "c" / "0").unlink()
    with pytest.raises(InputError, match=r"cells_v3.zarr:layers/counts/indices: chunk c/0 is "
                                         "missing"):
        open_dataset(f"{path}:layers/counts")


def test_a_corrupted_chunk_of_a_sparse_layer_names_the_element_and_rows(tmp_path):
    path = _copy("cells.zarr", tmp_path)
    (Path(path) / "layers" / "counts" / "data" / "0").write_bytes(b"not a blosc frame")
    inp = open_dataset(f"{path}:layers/counts")
    with pytest.raises(InputError, match=r"cells.zarr:layers/counts: rows 0:300 cannot be read"):
        inp.data.compute()


@pytest.mark.parametrize("store", STORES)
def test_estimators_fit_an_anndata_element_as_its_array(store):
    """Parity: Isomap of ``STORE:obsm/X_pca`` is Isomap of the array anndata was given, a
    NumPy array in the cells' order; transform of a sparse layer works likewise."""
    X_pca = TRUTH["obsm/X_pca"]
    reference = Isomap(n_neighbors=10, n_components=2).fit(X_pca)
    est = Isomap(n_neighbors=10, n_components=2)
    Y = est.fit_transform(f"{DATA / store}:obsm/X_pca")
    assert isinstance(Y, np.ndarray) and Y.dtype == np.float32  # scanpy's PCs are float32
    np.testing.assert_allclose(Y, reference.embedding_, rtol=1e-5, atol=1e-5)
    assert est.n_features_in_ == 5
    counts = Isomap(n_neighbors=10, n_components=2).fit(TRUTH["layers/counts"])
    np.testing.assert_allclose(
        np.asarray(counts.transform(f"{DATA / store}:layers/counts")),
        counts.transform(TRUTH["layers/counts"]), rtol=1e-5, atol=1e-5)


def test_a_non_finite_value_is_named_by_its_cell(tmp_path):
    path = _copy("cells.zarr", tmp_path)
    pcs = zarr.open_array(f"{path}/obsm/X_pca", mode="r+")
    pcs[7, 2] = np.nan
    with pytest.raises(ValueError, match="cell-007"):
        IKD(n_components=2).fit(f"{path}:obsm/X_pca")


def test_cli_embeds_an_obsm_element_and_names_the_rows_by_cell(tmp_path):
    """``dr-dask embed ikd --input cells.zarr:obsm/X_pca``: the run's embedding is IKD's of the
    array, its sample coordinate the cells' names; the input store is not modified."""
    store = DATA / "cells.zarr"
    before = _digest(store)
    out = tmp_path / "runs.zarr"
    res = CliRunner().invoke(main, ["--scheduler", "threads", "embed", "ikd", "-n", "2",
                                    "--input", f"{store}:obsm/X_pca", "--out", str(out),
                                    "--name", "cells"])
    assert res.exit_code == 0, res.output
    run = open_run(str(out), "cells")
    assert run["sample"][:].tolist() == OBS_NAMES.tolist()
    expected = IKD(n_components=2).fit(TRUTH["obsm/X_pca"]).embedding_
    np.testing.assert_allclose(run["embedding"][:], expected, rtol=1e-4, atol=1e-4)
    assert run.attrs["input"]["variable"] == "obsm/X_pca"
    assert _digest(store) == before


@pytest.mark.parametrize("store", ["cells.h5ad", "cells_v3.zarr"])
def test_cli_names_a_missing_element_and_exits_2(tmp_path, store):
    out = tmp_path / "runs.zarr"
    res = CliRunner().invoke(main, ["--scheduler", "threads", "embed", "isomap",
                                    "--input", f"{DATA / store}:obsm/X_umap", "--out", str(out)])
    assert res.exit_code == 2, res.output
    assert res.output.startswith("error:") and "has no element 'obsm/X_umap'" in res.output
    assert "obsm/X_pca" in res.output and "Traceback" not in res.output
    assert not out.exists()


def test_cli_writes_a_run_into_obsm_only_when_its_cells_match(tmp_path):
    """``dr-dask write-obsm RUN STORE``: a run of the store's element goes into obsm[X_<method>]
    by name; a run of another input (rows without the cells' names) is refused with exit 2 and
    the store left as it was, as is an existing key without --overwrite."""
    store = _copy("cells.zarr", tmp_path)
    runs = tmp_path / "runs.zarr"
    np.save(tmp_path / "pcs.npy", TRUTH["obsm/X_pca"])
    for source, name in ((f"{store}:obsm/X_pca", "cells"), (str(tmp_path / "pcs.npy"), "npy")):
        res = CliRunner().invoke(main, ["--scheduler", "threads", "embed", "isomap", "-n", "2",
                                        "--input", source, "--out", str(runs), "--name", name])
        assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["write-obsm", str(runs / "cells"), store])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["key"] == "X_isomap"
    written = open_dataset(f"{store}:obsm/X_isomap").data.compute()
    np.testing.assert_array_equal(written, open_run(str(runs), "cells")["embedding"][:])
    before = _digest(store)
    res = CliRunner().invoke(main, ["write-obsm", str(runs / "npy"), store, "--key", "X_npy"])
    assert res.exit_code == 2 and "row 0 is '0', the cell there is 'cell-000'" in res.output
    res = CliRunner().invoke(main, ["write-obsm", str(runs / "cells"), store])
    assert res.exit_code == 2 and "obsm['X_isomap'] exists" in res.output
    assert _digest(store) == before
    res = CliRunner().invoke(main, ["write-obsm", str(runs / "cells"), store, "--overwrite"])
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("store", STORES)
def test_write_obsm_writes_anndata_s_encoding_and_reads_back(tmp_path, store):
    path = _copy(store, tmp_path)
    Y = np.random.default_rng(0).normal(size=(300, 2)).astype(np.float32)
    write_obsm(path, "X_ikd", Y)
    back = open_dataset(f"{path}:obsm/X_ikd")
    np.testing.assert_array_equal(back.data.compute(), Y)
    np.testing.assert_array_equal(back.sample_ids, OBS_NAMES)
    if store.endswith(".zarr"):
        # anndata opens a store through its consolidated metadata: the new key is in it
        root = zarr.open_consolidated(path, mode="r")
        assert root.metadata.consolidated_metadata is not None
        assert "obsm/X_ikd" in root.metadata.consolidated_metadata.flattened_metadata
        assert dict(root["obsm/X_ikd"].attrs) == {"encoding-type": "array",
                                                  "encoding-version": "0.2.0"}
        written = zarr.open_group(DATA / store, mode="r").metadata.zarr_format
        assert root.metadata.zarr_format == written  # the store's own format
    # the run's labelled embedding (a DataFrame indexed by the cells) goes in by name
    labelled = pd.DataFrame(2 * Y, index=OBS_NAMES)
    write_obsm(path, "X_ikd", labelled, overwrite=True)
    np.testing.assert_array_equal(open_dataset(f"{path}:obsm/X_ikd").data.compute(), 2 * Y)


@pytest.mark.parametrize("store", ["cells.h5ad", "cells.zarr"])
@pytest.mark.parametrize(("Y", "message"), [
    (np.zeros((299, 2)), r"shape \(299, 2\); .* needs \(300, M\): one row per cell"),
    (pd.DataFrame(np.ones((300, 2)), index=np.roll(OBS_NAMES, 1)),
     r"not .* cells in order: row 0 is 'cell-299', the cell there is 'cell-000' \(300 rows"),
    (np.ones((300, 2)), r"obsm\['X_pca'\] exists; pass overwrite=True"),
])
def test_write_obsm_refuses_before_writing_anything(tmp_path, store, Y, message):
    path = _copy(store, tmp_path)
    before = _digest(path)
    key = "X_pca" if "exists" in message else "X_new"
    with pytest.raises(InputError, match=message):
        write_obsm(path, key, Y)
    assert _digest(path) == before


def test_write_obsm_refuses_a_store_that_is_not_anndata(tmp_path):
    zarr.save_array(str(tmp_path / "plain.zarr"), np.ones((3, 2)))
    with pytest.raises(InputError, match=r"is not an AnnData-Zarr store nor a \.h5ad file"):
        write_obsm(str(tmp_path / "plain.zarr"), "X_ikd", np.ones((3, 2)))


def test_anndata_stores_on_s3(s3_bucket, tmp_path):
    """An AnnData-Zarr store and a .h5ad file in an object store: read by row blocks, and the
    store takes an obsm written back."""
    import s3fs

    fs = s3fs.S3FileSystem()
    for store in ("cells_v3.zarr", "cells.h5ad"):
        fs.put(str(DATA / store), f"{s3_bucket}/{store}", recursive=True)
    for store, element in (("cells_v3.zarr", "layers/counts"), ("cells.h5ad", "obsm/X_pca"),
                           ("cells.h5ad", "layers/counts")):
        inp = open_dataset(f"s3://{s3_bucket}/{store}:{element}")
        np.testing.assert_array_equal(inp.data.compute(), TRUTH[element])
        np.testing.assert_array_equal(inp.sample_ids, OBS_NAMES)
    Y = np.arange(600, dtype=np.float64).reshape(300, 2)
    write_obsm(f"s3://{s3_bucket}/cells_v3.zarr", "X_ikd", Y)
    np.testing.assert_array_equal(
        open_dataset(f"s3://{s3_bucket}/cells_v3.zarr:obsm/X_ikd").data.compute(), Y)
    with pytest.raises(InputError, match="written in place on a local disk only"):
        write_obsm(Location(f"s3://{s3_bucket}/cells.h5ad"), "X_ikd", Y)


@pytest.mark.cluster
def test_workers_read_the_stored_elements_themselves(cluster_client):
    """On a multi-process cluster each worker opens the .h5ad file and the Zarr store by their
    location (the readers pickle as locations): IKD of a CSR layer equals IKD in-process."""
    local = IKD(n_components=2).fit(TRUTH["layers/counts"]).embedding_
    for store in ("cells.h5ad", "cells.zarr"):
        est = IKD(n_components=2, client=cluster_client).fit(f"{DATA / store}:layers/counts")
        np.testing.assert_allclose(np.abs(est.embedding_), np.abs(local), rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------- with the real anndata

def _run_with_anndata(code: str, tmp_path: Path) -> dict:
    """Run ``code`` under the anndata interpreter, this environment's packages after its own
    (so anndata gets its pandas, dr_dask the rest); its last stdout line is JSON."""
    script = tmp_path / "with_anndata.py"
    script.write_text(
        f"import site, sys, json\nsite.addsitedir({site.getsitepackages()[0]!r})\n"
        f"sys.path.append({str(ROOT)!r})\nDATA = {str(DATA)!r}\n" + textwrap.dedent(code))
    res = subprocess.run([str(ANNDATA_PYTHON), "-W", "ignore", str(script)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@needs_anndata
def test_anndata_reads_what_write_obsm_wrote(tmp_path):
    paths = {store: _copy(store, tmp_path) for store in STORES}
    Y = np.random.default_rng(1).normal(size=(300, 3))
    for path in paths.values():
        write_obsm(path, "X_ikd", Y)
    np.save(tmp_path / "Y.npy", Y)
    found = _run_with_anndata(f"""
        import anndata as ad, numpy as np
        Y = np.load("Y.npy")
        paths = {paths!r}
        out = {{}}
        for store, path in paths.items():
            a = ad.read_h5ad(path) if path.endswith(".h5ad") else ad.read_zarr(path)
            out[store] = [bool(np.array_equal(a.obsm["X_ikd"], Y)), sorted(a.obsm.keys()),
                          list(a.obs_names[:2])]
        print(json.dumps(out))
    """, tmp_path)
    for store in STORES:
        assert found[store] == [True, ["X_ikd", "X_pca", "cell_meta"], ["cell-000", "cell-001"]]


@needs_anndata
def test_real_anndata_objects_in_memory_and_backed(tmp_path):
    """A real AnnData object, in memory (dense X, CSR layer, CSC X, obsm) and backed (X an h5py
    dataset read from the file by row blocks), fits as its arrays do; write_obsm sets its
    obsm; a missing layer is named."""
    found = _run_with_anndata("""
        import anndata as ad, numpy as np
        from dr_dask import Isomap
        from dr_dask.io.anndata import write_obsm
        from dr_dask.io.inputs import InputError, open_dataset
        X, counts = np.load(DATA + "/X.npy"), np.load(DATA + "/counts.npy")
        ref = Isomap(n_neighbors=10, n_components=2).fit(X)
        out = {}
        a = ad.read_h5ad(DATA + "/cells.h5ad")
        Y = Isomap(n_neighbors=10, n_components=2).fit_transform(a)
        out["memory"] = [type(Y).__name__, bool(np.allclose(Y, ref.embedding_, atol=1e-5))]
        inp = open_dataset(a, "layers/counts")
        out["csr"] = [bool(np.array_equal(inp.data.compute(), counts)),
                      list(inp.sample_ids[:2])]
        sparse = a.copy()
        sparse.X = sparse.layers["counts_csc"]  # a CSC X, read by dense row blocks
        inp = open_dataset(sparse)
        out["csc"] = bool(np.array_equal(inp.data.compute(), counts))
        out["transform"] = bool(np.allclose(np.asarray(ref.transform(a)), ref.transform(X),
                                            atol=1e-5))
        write_obsm(a, "X_isomap", Y)
        out["obsm"] = bool(np.array_equal(a.obsm["X_isomap"], Y))
        b = ad.read_h5ad(DATA + "/cells.h5ad", backed="r")
        Yb = Isomap(n_neighbors=10, n_components=2).fit_transform(b)
        b.obsm["X_new"] = 2 * b.obsm["X_pca"]  # in memory only: read there, not from the file
        out["backed"] = [b.isbacked, type(b.X).__name__,
                         bool(np.allclose(Yb, ref.embedding_, atol=1e-5)),
                         open_dataset(b).location.url.endswith("cells.h5ad"),
                         bool(np.array_equal(open_dataset(b, "obsm/X_new").data.compute(),
                                             2 * np.load(DATA + "/X_pca.npy")))]
        try:
            open_dataset(a, "layers/raw")
        except InputError as exc:
            out["missing"] = str(exc)
        print(json.dumps(out))
    """, tmp_path)
    assert found["memory"] == ["ndarray", True]
    assert found["csr"] == [True, ["cell-000", "cell-001"]] and found["csc"]
    assert found["transform"] and found["obsm"]
    assert found["backed"] == [True, "Dataset", True, True, True]
    assert "has no element 'layers/raw'; it has X, layers/counts" in found["missing"]
