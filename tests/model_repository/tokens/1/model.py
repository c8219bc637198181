"""A stand-in LLM: streams the prompt's words back one response per token, as vLLM's and
TensorRT-LLM's Triton backends stream theirs (decoupled), ``token_delay_ms`` apart; with
``stream`` false (as vLLM's backend takes it, for Triton's ``generate``) one response holds them all.

While a file named ``hold`` is in the model's directory, it sends its first token and then waits
(up to 30 s) until the file is gone before the rest: a test can read the first token through
the whole chain while the model has not made the second, which no buffering proxy lets through.
"""

import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

HOLD_LIMIT_S = 30.0


class TritonPythonModel:
    def initialize(self, args):
        self.hold = os.path.join(args["model_repository"], "hold")

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self._generate, args=(request,), daemon=True).start()
        return None

    def _generate(self, request):
        sender = request.get_response_sender()
        try:
            prompt = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
            words = b" ".join(np.ravel(prompt)).decode("utf-8", "replace").split() or ["."]
            count = _scalar(request, "max_tokens", len(words))
            delay_s = _scalar(request, "token_delay_ms", 0.0) / 1000
            streamed = bool(_scalar(request, "stream", True))
            made = []
            for index in range(int(count)):
                if index == 1:
                    self._wait_while_held()
                if index and delay_s:
                    time.sleep(delay_s)
                made.append(words[index % len(words)] + " ")
                if streamed:
                    sender.send(_response(made[-1]))
            if not streamed:
                sender.send(_response("".join(made)))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as exc:  # the stream must end, with the error, whatever went wrong
            error = pb_utils.TritonError(f"generation failed: {exc}")
            sender.send(
                pb_utils.InferenceResponse(error=error), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            )

    def _wait_while_held(self):
        until = time.monotonic() + HOLD_LIMIT_S
        while os.path.exists(self.hold) and time.monotonic() < until:
            time.sleep(0.01)


def _response(text):
    out = pb_utils.Tensor("text_output", np.array([text.encode()], dtype=np.object_))
    return pb_utils.InferenceResponse(output_tensors=[out])


def _scalar(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else tensor.as_numpy().ravel()[0].item()
