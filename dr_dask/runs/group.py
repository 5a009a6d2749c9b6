"""Runs: one fit's resumable Zarr group in an output store, and running an estimator into one.

Each run writes into its own Zarr group (:class:`RunGroup`). A stage marks itself complete in
the group's attributes only after its arrays are fully written, and the run as a whole is marked
complete last, so a rerun after a crash redoes exactly the unfinished stages and nothing
half-written is ever reported as a result. Solvers see a run only through
:class:`dr_dask.io.checkpoint.Checkpoint`.

The completion mark vouches for the result's content, not only its names: it records the
SHA-256 of every stored chunk of every array it vouches for (``checksums``). Every reader of
a result compares them (:func:`verify_result`): a rerun finds a run whose chunk was overwritten
or truncated since "not complete" and redoes it, saying why; a read-only reader (``report``,
``evaluate``) refuses it with :class:`ResultCorrupted` naming the chunk (exit 2). A run
completed before marks carried checksums is read as complete, unverified, with a warning
(``docs/decisions.md`` RUN-CHECKSUMS).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import inspect
import json
import logging
import re
import warnings
from typing import Any, cast

import dask
import numpy as np
import scipy
import xarray
import zarr

import dr_dask
from dr_dask.io.inputs import (
    InputData,
    InputError,
    check_output_path,
    check_workers_can_read,
    open_dataset,
)
from dr_dask.io.jsonio import plain_json
from dr_dask.io.storage import Location, StorageError, location, raise_if_transient, read_array
from dr_dask.runs.lease import Lease, LeaseLost
from dr_dask.runtime.cluster import active_client
from dr_dask.runtime.credential_delivery import credentials_delivered
from dr_dask.runtime.resources import timed

logger = logging.getLogger(__name__)

#: The attribute that says a group is a run of this package (only such a group is resumed or
#: overwritten).
RUN_MARKER = "dr_dask_run"
#: A run name: one path segment of letters, digits, ``.``, ``_`` and ``-``, starting with a
#: letter or digit, at most 128 characters.
NAME_RULE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
#: Names a run may not take: the objects a store, a run or a job keeps beside its runs, and the
#: arrays of a run.
RESERVED_NAMES = frozenset({"zarr.json", "lease.json", "latest.json", "checkpoint.json",
                            "job.json", "done", "c", "embedding", "sample", "component"})
#: The attributes every run has carried since the first release: a group with all of them and
#: no marker is a run written before the marker existed.
LEGACY_RUN_ATTRS = ("params", "input", "versions", "stages", "complete")
#: The run's lease object, kept when ``overwrite`` replaces the run it guards.
LEASE = "lease.json"
#: The completion mark's record of each vouched array's chunks: array -> chunk key -> SHA-256.
CHECKSUMS = "checksums"


class ResultCorrupted(InputError):
    """A complete run's result no longer holds what its completion mark vouched for (a chunk
    overwritten, truncated, removed or added since): bad input to a reader (exit 2); a rerun
    of the run redoes it."""


def result_problems(run: Location, attrs: Any) -> list[str] | None:
    """What differs between the arrays of the complete run at ``run`` and the checksums its
    completion mark (``attrs``) recorded, one line per chunk; None for a mark without
    checksums (a run completed before they were recorded)."""
    recorded = attrs.get(CHECKSUMS)
    if not isinstance(recorded, dict):
        return None
    problems = []
    for array, chunks in sorted(recorded.items()):
        here = run.child(array)
        if not here.child("zarr.json").exists():
            problems.append(f"array {array} is gone")
            continue
        now = here.digests()
        for key in sorted(set(chunks) | set(now)):
            where = f"chunk {array}/{key}"
            if key not in now:
                problems.append(f"{where} is gone")
            elif key not in chunks:
                problems.append(f"{where} was not written by the run")
            elif now[key] != chunks[key]:
                problems.append(f"{where} does not match its checksum (overwritten or "
                                "truncated since the run completed)")
    return problems


def verify_result(run: Location, attrs: Any) -> None:
    """Raise :class:`ResultCorrupted` naming each chunk of the complete run at ``run`` that no
    longer matches its completion mark (``attrs``); a run completed before marks carried
    checksums is read unverified, with a warning."""
    problems = result_problems(run, attrs)
    if problems is None:
        logger.warning("run %s was completed before runs recorded checksums: its result is "
                       "read unverified (rerun it with --overwrite to record them)", run.url)
    elif problems:
        raise ResultCorrupted(
            f"run {run.url} is marked complete but its result was changed since: "
            f"{'; '.join(problems)}; rerun the command that wrote it to redo the run")


def check_run_name(name: str) -> str:
    """``name`` if it is a safe run name, else an :class:`InputError` naming the rule."""
    if not isinstance(name, str) or not NAME_RULE.fullmatch(name):
        raise InputError(
            f"run name {name!r} is not allowed: a run name is one path segment of letters, "
            "digits, '.', '_' and '-', starting with a letter or digit, at most 128 characters"
        )
    if name in RESERVED_NAMES or name.endswith((".json", ".report")):
        raise InputError(
            f"run name {name!r} is reserved (it names an object or array of the store: "
            f"{', '.join(sorted(RESERVED_NAMES))}, *.json, *.report); choose another run name"
        )
    return name


def _versions() -> dict:
    return {
        "dr_dask": dr_dask.__version__,
        "dask": dask.__version__,
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "zarr": zarr.__version__,
        "xarray": xarray.__version__,
    }


def run_name(method: str, params: dict, identity: dict) -> str:
    """Deterministic run name: the same method, parameters and input give the same group."""
    key = json.dumps({"params": params, "input": identity}, sort_keys=True, default=str)
    return f"{method}-{hashlib.sha1(key.encode()).hexdigest()[:10]}"


class RunGroup:
    """One run's Zarr group: arrays, provenance and stage-completion marks.

    Marks live in the group's attributes, i.e. its one small ``zarr.json`` object, rewritten
    (one PUT) only after the arrays a stage vouches for are fully written. A complete group is
    consolidated, so ``xarray.open_zarr(store, group=name)`` reads its metadata in one request.

    Parameters
    ----------
    store : str or Location
        Output Zarr store, local path or URL (created if absent).
    name : str
        Group name of this run inside the store.
    params : dict
        Method parameters (JSON-serialisable); a rerun with other parameters, or of other input,
        under the same name is refused unless ``overwrite``.
    identity : dict
        Input provenance and content (:attr:`InputData.identity`).
    overwrite : bool
        Replace an existing run of this name (a group of this package only), once the run
        holds its lease (:meth:`hold`).
    storage_options : dict, optional
        For the filesystem of a URL.

    Raises
    ------
    InputError
        An unsafe or reserved name (:func:`check_run_name`), a node of that name that is not a
        run of this package, or a run of other parameters or input without ``overwrite``.
    """

    def __init__(
        self,
        store: Any,
        name: str,
        *,
        params: dict,
        identity: dict,
        overwrite: bool = False,
        storage_options: dict | None = None,
    ):
        self.location = location(store, storage_options)
        self.location.check()
        self.store, self.name = self.location.url, check_run_name(name)
        self.created = self.replacing = False
        self.lease: Lease | None = None
        #: This run created the store itself (so a rejected input leaves no empty store behind).
        self.created_store = not self.location.child("zarr.json").exists()
        params = plain_json(params)
        identity = plain_json(identity)
        self._fresh: dict[str, Any] = {RUN_MARKER: 1, "params": params, "input": identity,
                                       "versions": _versions(), "stages": {},
                                       "complete": False}
        root = self._root()
        self.group: zarr.Group
        if name in root:
            existing = root[name]
            if not isinstance(existing, zarr.Group) or not _is_run(existing):
                kind = "an array" if isinstance(existing, zarr.Array) else "a group"
                raise InputError(
                    f"{self.path} is {kind} that is not a run of dr_dask (it has no "
                    f"{RUN_MARKER!r} attribute); it is left alone: choose another run name"
                )
            self.group = existing
            if overwrite:  # replaced only once this run holds the lease (hold)
                self.replacing = True
                return
            old = self.group.attrs.get("params")
            if old is not None and old != params:
                raise InputError(
                    f"{self.path} holds a run with other parameters; pass overwrite=True "
                    "(--overwrite) or choose another run name"
                )
            old_input = self.group.attrs.get("input")
            if old_input is not None and identity and old_input != identity:
                raise InputError(
                    f"{self.path} holds a run of other input (recorded {_describe(old_input)}, "
                    f"now {_describe(identity)}); pass overwrite=True (--overwrite) to replace it "
                    "or choose another run name"
                )
            logger.info("resuming run %s (stages done: %s)", self.path, self.done_stages)
        else:
            self.created = True
            self.group = self._create(root)

    def _create(self, root: zarr.Group) -> zarr.Group:
        # the group and its marker in one write: a disk that fills between the two would
        # leave a group no rerun may touch (it would not be a run of this package)
        return root.create_group(self.name, attributes={
            **self._fresh, "created": _dt.datetime.now(_dt.UTC).isoformat()})

    @property
    def lease_location(self) -> Location:
        """The run's lease object (:class:`dr_dask.runs.lease.Lease`)."""
        return self.location.child(self.name, LEASE)

    def hold(self, lease: Lease) -> None:
        """Write under ``lease`` from now on: every mark is fenced (:meth:`Lease.fence`) and
        carries its token. A pending ``overwrite`` happens here, under the lease: the old
        run's arrays and marks are deleted (the lease object is kept) and the group restarts.
        """
        self.lease = lease
        if self.replacing:
            lease.fence()
            here = self.location.child(self.name)
            for entry in here.listdir():
                if entry != LEASE:
                    here.child(entry).delete()
            self.group = self._create(self._root())
            self.replacing, self.created = False, True
            logger.info("replaced the run %s (overwrite)", self.path)
        else:
            self.refresh()

    def _stamps(self) -> list[dict]:
        marks = [*self._stages.values(), dict(self.group.attrs)]
        return [m["lease"] for m in marks if isinstance(m.get("lease"), dict)]

    @property
    def last_token(self) -> int:
        """The largest lease token the run's marks carry (0: none)."""
        return max([int(s.get("token") or 0) for s in self._stamps()], default=0)

    def _fence(self) -> dict | None:
        """The lease's stamp ``{token, owner}`` after a successful fence (None for a run
        written without a lease); LeaseLost, naming the run's newest writer, if it was lost."""
        if self.lease is None:
            return None
        try:
            return self.lease.stamp()
        except LeaseLost as exc:
            try:
                self.refresh()
            except Exception:  # noqa: BLE001  (the group is gone too: the lease's message must do)
                raise exc from None
            newest = max(self._stamps(), key=lambda s: int(s.get("token") or 0), default={})
            if int(newest.get("token") or 0) > self.lease.token:
                raise LeaseLost(f"{exc}; {self.path} was since written by {newest['owner']} "
                                f"(token {newest['token']})") from None
            raise

    def refresh(self) -> None:
        """Re-read the group's marks (another process may have written them)."""
        self.group = zarr.open_group(store=self.location.zarr_store(), path=self.name, mode="r+",
                                     use_consolidated=False)

    def _root(self) -> zarr.Group:
        # never through the root's consolidated metadata: it is a snapshot that may predate
        # other runs of the store (use it to read, not to decide what exists)
        return zarr.open_group(store=self.location.zarr_store(), mode="a", use_consolidated=False)

    @property
    def path(self) -> str:
        return f"{self.store.rstrip('/')}/{self.name}"

    def child(self, name: str) -> Location:
        """Location of array ``name`` of this run (tile caches, path matrices)."""
        return self.location.child(self.name, name)

    def _attr_dict(self, key: str) -> dict[str, Any]:
        return run_attr(self.group, key)

    @property
    def _stages(self) -> dict[str, Any]:
        return self._attr_dict("stages")

    @property
    def summary(self) -> dict[str, Any]:
        """The run's summary (written by :meth:`mark_complete`; empty until then)."""
        return self._attr_dict("summary")

    @property
    def done_stages(self) -> list[str]:
        return sorted(self._stages)

    @property
    def complete(self) -> bool:
        """Marked complete, every array the completion mark vouches for still there (checked in
        the store, not in consolidated metadata), and each of their chunks still what the mark
        recorded (:func:`result_problems`; a run completed before marks carried checksums is
        complete, unverified)."""
        if self.replacing or not self.group.attrs.get("complete", False):
            return False
        vouched = cast(list, self.group.attrs.get("arrays") or [])
        missing = [a for a in vouched if not self.child(a).child("zarr.json").exists()]
        if missing:
            logger.warning("run %s is marked complete but its arrays %s are gone: redoing it",
                           self.path, missing)
            return False
        problems = result_problems(self.location.child(self.name), self.group.attrs)
        if problems is None:
            logger.warning("run %s was completed before runs recorded checksums: taken as "
                           "complete, unverified (--overwrite redoes it)", self.path)
        elif problems:
            logger.warning("run %s is marked complete but %s: redoing it", self.path,
                           "; ".join(problems))
            return False
        return True

    def is_done(self, stage: str) -> bool:
        return stage in self._stages

    def mark_done(self, stage: str, **info: Any) -> None:
        """Record ``stage`` as complete; call only after its arrays are fully written."""
        stamp = self._fence()
        stages = dict(self._stages)
        stages[stage] = {
            "finished": _dt.datetime.now(_dt.UTC).isoformat(), "lease": stamp,
            **plain_json(info),
        }
        self.group.attrs["stages"] = stages

    def stage_info(self, stage: str) -> dict:
        return dict(self._stages.get(stage, {}))

    @property
    def caches(self) -> list[str]:
        """Arrays kept only for a rerun to resume from (:meth:`note_cache`)."""
        return list(cast(list, self.group.attrs.get("caches") or []))

    def note_cache(self, name: str) -> None:
        """Record array ``name`` as a cache of this run (``drop_cache`` deletes it)."""
        if name not in self.caches:
            self._fence()
            self.group.attrs["caches"] = [*self.caches, name]

    def mark_complete(self, arrays: tuple[str, ...] = (), **summary: Any) -> None:
        """The last writes of a run: the completion mark (vouching for ``arrays``, the
        results: a run missing one of them is not complete), then consolidated metadata of the
        run group and of the store's root (what ``xarray.open_zarr(store, group=name)``
        reads). The mark records the checksum of every stored chunk of ``arrays``
        (:data:`CHECKSUMS`), which every reader of the result compares."""
        checksums = {a: self.child(a).digests() for a in arrays}
        stamp = self._fence()
        self.group.attrs.update(
            {"complete": True, "arrays": list(arrays), CHECKSUMS: checksums, "lease": stamp,
             "summary": plain_json(summary)}
        )
        self.consolidate()

    def consolidate(self) -> None:
        with warnings.catch_warnings():  # "not part of the v3 spec": xarray and zarr read it
            warnings.simplefilter("ignore", UserWarning)
            zarr.consolidate_metadata(self.location.zarr_store(), path=self.name)
            zarr.consolidate_metadata(self.location.zarr_store())

    def drop(self, *names: str) -> None:
        """Delete intermediate arrays (a tile cache) that the result no longer needs."""
        present = [n for n in names if n in self.group]
        if present:
            self._fence()
        for name in present:
            self.child(name).delete()
        if present and self.group.attrs.get("complete", False):
            self.consolidate()

    def create(self, name: str, shape: tuple, dtype: Any, chunks: tuple, dims: tuple) -> zarr.Array:
        """(Re)create an array of this run; a stage rewrites its arrays from scratch."""
        self._fence()
        return self.group.create_array(
            name, shape=shape, dtype=dtype, chunks=chunks, dimension_names=dims,
            compressors=None, fill_value=0, overwrite=True,
        )

    def write(self, name: str, values: np.ndarray, dims: tuple, attrs: dict | None = None) -> None:
        """Write a small in-memory array in one go."""
        values = np.asarray(values)
        if values.dtype.kind == "U":  # names (an AnnData's cells): Zarr's variable-length
            # strings; fixed-width unicode has no Zarr format 3 specification (zarr warns)
            values = values.astype(np.dtypes.StringDType())
        arr = self.create(name, values.shape, values.dtype, values.shape, dims)
        arr[...] = values
        if attrs:
            arr.attrs.update(plain_json(attrs))

    def read(self, name: str) -> np.ndarray:
        return read_array(self.group, name)


def run_attr(group: zarr.Group, key: str) -> dict[str, Any]:
    """The object a run group records under attribute ``key`` (``input``, ``params``,
    ``summary``, ``stages``...), empty when absent."""
    # zarr types an attribute as any JSON value; these keys hold the objects RunGroup writes
    return cast(dict[str, Any], group.attrs.get(key) or {})


def open_run(store: Any, name: str, storage_options: dict | None = None) -> zarr.Group:
    """A run group for reading (consolidated metadata when the run is complete); a complete
    run's result is verified against its completion mark (:class:`ResultCorrupted`)."""
    loc = location(store, storage_options)
    check_run_name(name)
    try:
        group = zarr.open_group(store=loc.zarr_store(read_only=True), path=name, mode="r")
    except StorageError:
        raise
    except Exception as exc:  # noqa: BLE001  (zarr raises many types for a node that is no group)
        raise_if_transient(exc, loc)
        raise InputError(f"{loc}/{name} is not a readable run group: {exc}") from None
    if group.attrs.get("complete", False):
        verify_result(loc.child(name), group.attrs)
    return group


def _describe(identity: Any) -> str:
    return f"shape {identity.get('shape')}, fingerprint {identity.get('fingerprint')}"


#: Estimator parameters that say how to run, not what to compute: not part of a run's identity.
_EXECUTION_PARAMS = {"client", "progress", "tile_cache", "tile_size", "scratch"}


def run_params(estimator: Any) -> dict:
    return {
        k: v for k, v in estimator.get_params().items()
        if k not in _EXECUTION_PARAMS and not k.startswith("_")
    }


def run_embedding(
    estimator: Any,
    source: Any,
    out: Any,
    *,
    method: str,
    name: str | None = None,
    overwrite: bool = False,
    storage_options: dict | None = None,
    drop_cache: bool = False,
) -> RunGroup:
    """Fit ``estimator`` on ``source`` and write its embedding into a run group of ``out``.

    The run group is named from the method, parameters and input identity, so rerunning the
    same command after an interruption resumes it (estimators whose ``fit`` takes ``run=``
    resume stage by stage) and rerunning a finished one returns at once.

    Parameters
    ----------
    estimator : estimator with ``fit_transform``
        Estimators whose ``fit`` takes ``run=`` (IKD) keep their stages in the run group.
    source : str or array-like
        Anything :func:`dr_dask.io.inputs.open_dataset` accepts, or an :class:`InputData`.
    out : str or Location
        Output Zarr store, local path or URL (never the input).
    method : str
        Method label recorded in the run.
    name : str, optional
        Run group name (default: derived from method, parameters and input); one path
        segment (:func:`check_run_name`).
    overwrite : bool
        Replace an existing run of that name (a run of this package only, and only once this
        run holds the lease).
    storage_options : dict, optional
        For the filesystems of ``source`` and ``out`` when they are URLs.
    drop_cache : bool
        Delete the run's caches (the arrays its solver kept for a rerun to resume from, such
        as IKD's distance tiles) once it is complete.

    Returns
    -------
    RunGroup
        Its ``embedding`` array has dims (sample, component) and a ``sample`` coordinate.
    """
    # the credentials delivered to the workers live as long as the run
    with credentials_delivered(active_client(getattr(estimator, "client", None))):
        return _run_embedding(estimator, source, out, method=method, name=name,
                              overwrite=overwrite, storage_options=storage_options,
                              drop_cache=drop_cache)


def _run_embedding(estimator: Any, source: Any, out: Any, *, method: str, name: str | None,
                   overwrite: bool, storage_options: dict | None,
                   drop_cache: bool) -> RunGroup:
    inp = source if isinstance(source, InputData) else open_dataset(source, None, storage_options)
    check_output_path(out, inp)
    client = active_client(getattr(estimator, "client", None))
    check_workers_can_read(inp, client)
    identity = inp.identify(client)  # content: hashed on the workers if the store keeps no tag
    params = run_params(estimator)
    run = RunGroup(
        out,
        name or run_name(method, params, identity),
        params={"method": method, **params},
        identity=identity,
        overwrite=overwrite,
        storage_options=storage_options,
    )
    if run.complete:
        logger.info("run %s is already complete", run.path)
        return run
    with Lease(run.lease_location, token_floor=run.last_token, delete_on_release=True) as lease:
        run.hold(lease)
        if run.complete:  # finished by another run between our first look and the lease
            return run
        return _fit_into(estimator, inp, run, method, drop_cache)


def _fit_into(estimator: Any, inp: InputData, run: RunGroup, method: str,
              drop_cache: bool) -> RunGroup:
    try:
        with timed() as took:
            if "run" in inspect.signature(estimator.fit).parameters:
                emb = estimator.fit(inp, run=run).embedding_
            elif "scratch" in estimator.get_params():
                # the input itself, not its rows: the workers' scratch goes next to it
                emb = estimator.fit_transform(inp)
            else:  # any scikit-learn transformer (PCA, ...): its fit_transform is the embedding
                emb = estimator.fit_transform(inp.data)
    except ValueError:  # rejected input or parameters: leave no run group behind
        if run.created and not run.done_stages:
            run.location.child(run.name).delete()
            # nor the store this run created, unless another run has appeared in it since
            if run.created_store and not [*run._root().group_keys()]:
                run.location.delete()
        raise
    seconds = took["seconds"]
    emb = np.asarray(emb.compute() if hasattr(emb, "compute") else emb)
    check_embedding(emb, run.path)
    ids = inp.sample_ids if inp.sample_ids is not None else np.arange(emb.shape[0])
    run.write("sample", ids, ("sample",))
    run.write("component", np.arange(emb.shape[1]), ("component",))
    run.write("embedding", emb, ("sample", "component"), {"method": method})
    summary: dict[str, Any] = {"method": method, "fit_seconds": seconds, "shape": emb.shape}
    for attr in ("eigenvalues_", "explained_variance_ratio_", "reference_index_", "sigma2_",
                 "knn_recall_", "knn_distance_error_"):
        value = getattr(estimator, attr, None)
        if value is not None:
            summary[attr.rstrip("_")] = np.asarray(value).tolist()
    run.mark_complete(arrays=("sample", "component", "embedding"), **summary)
    if drop_cache:
        run.drop(*run.caches)
    logger.info("run %s complete in %.1f s", run.path, seconds)
    return run


def check_embedding(emb: np.ndarray, where: str) -> None:
    """Refuse to mark a run complete on an embedding no input could have produced."""
    if not np.isfinite(emb).all():
        raise InputError(f"{where}: the embedding has non-finite values; not marked complete")
    if emb.size and not np.any(emb):
        raise InputError(
            f"{where}: the embedding is all zeros (were fill values read instead of data?); "
            "not marked complete"
        )


def _is_run(group: zarr.Group) -> bool:
    """Whether ``group`` is a run of this package (its marker, or a run from before the marker)."""
    attrs = group.attrs
    return bool(attrs.get(RUN_MARKER)) or all(key in attrs for key in LEGACY_RUN_ATTRS)
