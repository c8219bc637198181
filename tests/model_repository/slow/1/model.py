"""Sleeps for DELAY_MS per request (and init_delay_s at load) so tests can reach deadlines and start-up windows.

While a file named ``wedged`` is in the model's directory, every request fails as a model on a hung
GPU does (503, Triton's UNAVAILABLE), the server's metrics and readiness answering as before."""

import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.wedged = os.path.join(args["model_repository"], "wedged")
        params = json.loads(args["model_config"]).get("parameters", {})
        configured = params.get("init_delay_s", {}).get("string_value", "0")
        time.sleep(float(os.environ.get("SLOW_INIT_DELAY_S", configured)))

    def execute(self, requests):
        responses = []
        for request in requests:
            if os.path.exists(self.wedged):
                error = pb_utils.TritonError("wedged", pb_utils.TritonError.UNAVAILABLE)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            delay = pb_utils.get_input_tensor_by_name(request, "DELAY_MS").as_numpy()
            time.sleep(float(delay[0]) / 1000)
            out = pb_utils.Tensor("SLEPT_MS", delay.astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
