"""Element-wise sum and difference of two FP32 vectors: the example every part of Spillway serves."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        pass

    def execute(self, requests):
        responses = []
        for request in requests:
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            out0 = pb_utils.Tensor("OUTPUT0", (in0 + in1).astype(np.float32))
            out1 = pb_utils.Tensor("OUTPUT1", (in0 - in1).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out0, out1]))
        return responses
