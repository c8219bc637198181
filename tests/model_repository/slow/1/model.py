"""Sleeps for DELAY_MS per request (and init_delay_s at load) so tests can reach deadlines and start-up windows."""

import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        configured = params.get("init_delay_s", {}).get("string_value", "0")
        time.sleep(float(os.environ.get("SLOW_INIT_DELAY_S", configured)))

    def execute(self, requests):
        responses = []
        for request in requests:
            delay = pb_utils.get_input_tensor_by_name(request, "DELAY_MS").as_numpy()
            time.sleep(float(delay[0]) / 1000)
            out = pb_utils.Tensor("SLEPT_MS", delay.astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
