"""``PlanResult`` renders as every reading does (``Rendered``): ``str()`` is ``table()``, and
``to_json`` is ``to_dict`` written as JSON (the 0.2 ``device`` key kept)."""

from __future__ import annotations

import json

from flopcount.planning.result import CommRow, PlanResult


def test_plan_result_json_is_its_dict() -> None:
    result = PlanResult(
        fsdp=2, tp=1, on="h100", dtype="float32", flops={"forward": 6, "backward": 12, "optimizer": 4},
        macs={"forward": 3, "backward": 6, "optimizer": 0}, peak_bytes=100, memory={"activations": 40},
        state_bytes={"parameters": 8}, comm=(CommRow("all_gather", "dp", 2, 3, 64, 32, None, {"forward": 3}),),
        step_time=None,
    )
    data = json.loads(result.to_json())
    assert data == json.loads(json.dumps(result.to_dict()))
    assert data["total_flops"] == 6 + 12 + 4 and data["world_size"] == 2 and data["device"] == "h100"
    assert data["comm"][0]["wire_bytes"] == 32 and str(result) == result.table()
