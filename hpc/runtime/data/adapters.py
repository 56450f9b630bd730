"""Accelerate's data-loader classes, the ones `prepare()` returns: DataLoaderShard (each rank reads its share),
DataLoaderDispatcher (rank 0 reads and sends each rank its batch), and SkipDataLoader, with DataLoaderAdapter's
and DataLoaderStateMixin's behaviour (`isinstance(dl, DataLoader)`, `.base_dataloader`, `end_of_dataloader`,
`remainder`, attribute reads falling through to the loader underneath).

DataLoaderShard and DataLoaderDispatcher are hpc's prepared loader (prepare.PreparedDataLoader: it deals by
position, so a checkpoint records where the epoch stands and resumes at another world size) under Accelerate's
names. Built as Accelerate's constructors build them, `DataLoaderShard(dataset, batch_size=4, ...)` is one
process's loader over a DataLoader made from the keywords, and `DataLoaderDispatcher(dataset, ...)` one that rank 0
reads for every process of PartialState().
"""

from __future__ import annotations

import contextlib

from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from hpc.errors import HpcError
from hpc.runtime.configuration import DataLoaderConfiguration
from hpc.runtime.data.prepare import PreparedDataLoader, _stateful_class
from hpc.runtime.data.sampler_shards import get_sampler
from hpc.runtime.process.gradient_state import GradientState
from hpc.runtime.tracking.rank_logging import get_logger

logger = get_logger(__name__)


def _new(cls):
    return object.__new__(cls)


class DataLoaderStateMixin:
    """`end_of_dataloader` (the batch just handed out is the epoch's last) and `remainder` (how many samples of
    that last batch are real), and the loader's registration as the gradient state's active loader."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.end_of_dataloader = False
        cls.remainder = -1

    def reset(self) -> None:
        self.end_of_dataloader = False
        self.remainder = -1

    def begin(self) -> None:
        """Makes this loader the gradient state's active one, its remainder known up front where it can be."""
        self.reset()
        with contextlib.suppress(Exception):
            if not self._drop_last:
                length = getattr(self.dataset, "total_dataset_length", len(self.dataset))
                self.remainder = length % self.total_batch_size
        self.gradient_state._add_dataloader(self)

    def end(self) -> None:
        self.gradient_state._remove_dataloader(self)


class DataLoaderAdapter:
    """Wraps a DataLoader (a torchdata StatefulDataLoader with ``use_stateful_dataloader``) built from the
    keywords: attributes it does not have are the wrapped loader's, and `isinstance(obj, DataLoader)` holds (its
    `__class__` is the wrapped loader's class, as Accelerate's; `type(obj)` stays the adapter)."""

    def __init__(self, dataset, use_stateful_dataloader: bool = False, batch_sampler=None, **kwargs):
        self.use_stateful_dataloader = use_stateful_dataloader
        cls = _stateful_class(DataLoaderConfiguration(use_stateful_dataloader=True)) if use_stateful_dataloader \
            else DataLoader
        self.base_dataloader = cls(dataset, batch_sampler=batch_sampler, **kwargs)
        if hasattr(self.base_dataloader, "state_dict"):
            self.dl_state_dict = self.base_dataloader.state_dict()

    def __getattr__(self, name):
        if name == "base_dataloader":  # not set yet (or on the class): no recursion
            raise AttributeError(name)
        return getattr(self.base_dataloader, name)

    @property
    def __class__(self):
        return self.base_dataloader.__class__

    def __reduce_ex__(self, protocol):
        # pickle would read the class from __class__ (the wrapped loader's): rebuild this class, then its state
        return _new, (type(self),), self.__dict__

    def state_dict(self):
        return self.dl_state_dict

    def load_state_dict(self, state_dict) -> None:
        self.base_dataloader.load_state_dict(state_dict)

    def __len__(self) -> int:
        return len(self.base_dataloader)

    def adjust_state_dict_for_prefetch(self) -> None:
        """Hook for a subclass whose base loader runs ahead of what it hands out (none here needs one)."""

    def _update_state_dict(self) -> None:
        if hasattr(self.base_dataloader, "state_dict"):
            self.dl_state_dict = self.base_dataloader.state_dict()
            self.adjust_state_dict_for_prefetch()
            self.dl_state_dict["_iterator_finished"] = self.end_of_dataloader

    def get_sampler(self):
        return get_sampler(self)

    def set_sampler(self, sampler) -> None:
        if isinstance(self.sampler, BatchSampler):
            self.sampler.sampler = sampler
        else:
            self.batch_sampler.sampler = sampler
            if hasattr(self.batch_sampler, "batch_sampler"):
                self.batch_sampler.batch_sampler.sampler = sampler


class _Prepared(PreparedDataLoader, DataLoaderAdapter, DataLoaderStateMixin):
    """hpc's prepared loader with Accelerate's adapter surface. `from_loader` is how prepare() builds one; the
    subclasses' constructors take Accelerate's arguments."""

    rng_types = None
    synchronized_generator = None
    skip_batches = 0

    @classmethod
    def from_loader(cls, loader: DataLoader, **engine):
        self = object.__new__(cls)
        PreparedDataLoader.__init__(self, loader, **engine)
        self.use_stateful_dataloader = bool(self.config.use_stateful_dataloader)
        self._drop_last = bool(getattr(loader, "drop_last", False))
        return self

    def _setup(self, dataset, world: int, rank: int, device, config: DataLoaderConfiguration, iteration: int,
               use_stateful_dataloader: bool, kwargs: dict):
        DataLoaderAdapter.__init__(self, dataset, use_stateful_dataloader=use_stateful_dataloader, **kwargs)
        PreparedDataLoader.__init__(self, self.base_dataloader, world=world, rank=rank, device=device,
                                    config=config, gradient_state=GradientState())
        if iteration:
            self.set_epoch(iteration)

    def __iter__(self):
        if self.skip_batches and self._start == 0:  # built with skip_batches: every pass skips them
            self._start = self.skip_batches * self._round
        if self.rng_types:
            from hpc.runtime.process.random_states import synchronize_rng_states

            synchronize_rng_states(self.rng_types, self.synchronized_generator)
        yield from PreparedDataLoader.__iter__(self)

    @property
    def split_batches(self) -> bool:
        return self.layout.split

    @split_batches.setter
    def split_batches(self, value: bool) -> None:
        if bool(value) != self.layout.split:
            raise HpcError("split_batches is fixed when the loader is built", fix="pass it to prepare_data_loader")

    @property
    def total_dataset_length(self) -> int:
        return getattr(self.dataset, "total_length", None) or len(self.dataset)


class DataLoaderShard(_Prepared):
    """One process's batches, on ``device``. What prepare() returns for a loader each rank reads its share of."""

    def __init__(self, dataset, device=None, rng_types=None, synchronized_generator=None, skip_batches: int = 0,
                 use_stateful_dataloader: bool = False, _drop_last: bool = False, _non_blocking: bool = False,
                 torch_device_mesh=None, iteration: int = 0, **kwargs):
        # the loader built here is already this process's (as Accelerate's): hpc reads it as a world of one
        config = DataLoaderConfiguration(non_blocking=_non_blocking, use_stateful_dataloader=use_stateful_dataloader)
        self._setup(dataset, 1, 0, device, config, iteration, use_stateful_dataloader, kwargs)
        self.rng_types, self.synchronized_generator = rng_types, synchronized_generator
        self.skip_batches, self._drop_last = skip_batches, _drop_last


class DataLoaderDispatcher(_Prepared):
    """Rank 0 reads the loader and sends each process its batch (its slice of the batch with ``split_batches``).
    What prepare() returns with dispatch_batches (by default for an iterable dataset)."""

    def __init__(self, dataset, split_batches: bool = False, skip_batches: int = 0,
                 use_stateful_dataloader: bool = False, _drop_last: bool = False, _non_blocking: bool = False,
                 slice_fn=None, torch_device_mesh=None, iteration: int = 0, **kwargs):
        if slice_fn is not None or torch_device_mesh is not None:
            raise HpcError("DataLoaderDispatcher(slice_fn=/torch_device_mesh=) is not supported by hpc: rank 0 sends "
                           "each data-parallel rank its own whole batch",
                           fix="drop them; for tensor parallelism prepare() the loader (each rank reads its share)")
        from hpc.runtime.process.state import PartialState

        state = PartialState()
        config = DataLoaderConfiguration(split_batches=split_batches, dispatch_batches=True,
                                         non_blocking=_non_blocking, use_stateful_dataloader=use_stateful_dataloader)
        self._setup(dataset, state.num_processes, state.process_index, state.device, config, iteration,
                    use_stateful_dataloader, kwargs)
        self.skip_batches, self._drop_last = skip_batches, _drop_last
        self.state = state


class SkipDataLoader(DataLoaderAdapter, DataLoaderStateMixin):
    """A DataLoader built from the keywords whose passes start after their first ``skip_batches`` batches (read and
    passed over: for a loader whose batches cannot be addressed, such as an iterable dataset's)."""

    def __init__(self, dataset, skip_batches: int = 0, use_stateful_dataloader: bool = False, **kwargs):
        super().__init__(dataset, use_stateful_dataloader=use_stateful_dataloader, **kwargs)
        self.skip_batches = skip_batches
        self.gradient_state = GradientState()
        self._drop_last = bool(kwargs.get("drop_last", False))

    @property
    def total_batch_size(self):
        return self.base_dataloader.batch_size

    def __iter__(self):
        self.begin()
        try:
            for index, batch in enumerate(self.base_dataloader):
                if index >= self.skip_batches:
                    self._update_state_dict()
                    yield batch
        finally:
            self.end()

    def __len__(self) -> int:
        return len(self.base_dataloader) - self.skip_batches


def prepared_loader(loader: DataLoader, config: DataLoaderConfiguration, **engine) -> _Prepared:
    """The Accelerate class prepare() gives for ``loader``: a DataLoaderDispatcher when rank 0 reads for all
    (dispatch_batches, by default for an iterable dataset), otherwise a DataLoaderShard."""
    dispatch = config.dispatch_batches if config.dispatch_batches is not None else \
        isinstance(loader.dataset, IterableDataset)
    cls = DataLoaderDispatcher if dispatch else DataLoaderShard
    return cls.from_loader(loader, config=config, **engine)


class MpDeviceLoaderWrapper:
    """Accelerate's loader for PyTorch/XLA (TPU) devices. hpc runs no XLA: building one says so in one line."""

    def __init__(self, dataloader, device):
        raise HpcError("MpDeviceLoaderWrapper needs PyTorch/XLA (a TPU), which hpc does not run on",
                       fix="use the loader prepare() returns (a DataLoaderShard) as it is")
