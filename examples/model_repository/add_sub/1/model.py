"""Element-wise sum and difference of two FP32 vectors: the example every part of Spillway serves.

The optional model parameter ``delay_ms`` makes each request take that long (batched or not), so
the demo can stand the example in for a heavier model and give a cluster a small, known capacity.
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.delay_s = float(parameters.get("delay_ms", {}).get("string_value", "0")) / 1000

    def execute(self, requests):
        if self.delay_s:
            time.sleep(self.delay_s * len(requests))
        responses = []
        for request in requests:
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            out0 = pb_utils.Tensor("OUTPUT0", (in0 + in1).astype(np.float32))
            out1 = pb_utils.Tensor("OUTPUT1", (in0 - in1).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out0, out1]))
        return responses
