"""Sums a 1 MiB FP32 tensor: a large request with a tiny answer, so the bench times the request path."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests: list) -> list:
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            total = np.array([data.sum(dtype=np.float64)], dtype=np.float32)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("SUM", total)]))
        return responses
