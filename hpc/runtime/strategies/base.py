from __future__ import annotations

import contextlib

import torch


class Strategy:
    """Wrap models for a way of training; say how to skip gradient sync; undo the wrapping."""

    name = "base"

    def __init__(self, state, handlers: dict):
        self.state, self.handlers = state, handlers

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        raise NotImplementedError

    def no_sync(self, model: torch.nn.Module):
        return contextlib.nullcontext()

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model


class SingleProcess(Strategy):
    name = "single"

    def wrap_model(self, model):
        return model.to(self.state.device)
