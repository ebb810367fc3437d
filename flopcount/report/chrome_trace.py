"""A profiler Chrome trace with flopcount's figures in each joined op event's ``args``
(Perfetto and the TensorBoard profiler plugin show ``args`` beside the event)."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Dict, Mapping

from flopcount.core.rendering import renders

if TYPE_CHECKING:
    from flopcount.profiling.result import ProfileResult


def enriched_trace(trace: Mapping[str, Any], args_by_id: Mapping[int, Mapping[str, Any]]) -> Dict[str, Any]:
    """A copy of ``trace`` whose CPU op events (matched by the profiler's ``External id``,
    the ``FunctionEvent.id`` of the joined top-level op) carry the given extra ``args``;
    a figure that does not apply (a view's efficiency and intensity) is null. Seconds
    (``attainable_s``) are written in the trace's unit, microseconds (``attainable_us``)."""
    data = copy.deepcopy(dict(trace))
    for event in data.get("traceEvents", ()):
        if not isinstance(event, dict) or event.get("cat") != "cpu_op":
            continue
        args = event.get("args")
        if not isinstance(args, dict):
            continue
        extra = args_by_id.get(args.get("External id", -1))
        if extra is not None:
            # None stays (JSON null): a view's efficiency is "none", not 0.0
            args.update((_US.get(key, key), value * 1e6 if key in _US else value) for key, value in extra.items())
    return data


#: figures in seconds in the data -> their name in the trace's microseconds
_US = {"attainable_s": "attainable_us"}


@renders("ProfileResult", "chrome_trace")
def profile_chrome_trace(result: ProfileResult) -> Dict[str, Any]:
    """The profile's kept Chrome trace with each joined op's figures (``ProfileResult.trace_args``)."""
    if result.trace is None:
        raise ValueError("this profile kept no trace (profile(..., keep_trace=False))")
    return enriched_trace(result.trace, result.trace_args)
