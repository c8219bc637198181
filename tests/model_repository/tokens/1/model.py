"""A stand-in LLM: streams the prompt's words back one response per token, as vLLM's and
TensorRT-LLM's Triton backends stream theirs (decoupled), ``token_delay_ms`` apart, the first after
``first_token_delay_ms`` (the prompt's prefill); with
``stream`` false (as vLLM's backend takes it, for Triton's ``generate``) one response holds them all.

While a file named ``hold`` is in the model's directory, it sends its first token and then waits
(up to 30 s) until the file is gone before the rest: a test can read the first token through
the whole chain while the model has not made the second, which no buffering proxy lets through.

It exports the gauges vLLM's Triton backend does, under the same names: ``vllm:num_requests_running``
(its generations in progress), ``vllm:num_requests_waiting`` and ``vllm:gpu_cache_usage_perc``
(the running ones' share of ``KV_SLOTS``), the last two overridden by a number in a file named
``waiting`` or ``kv_cache`` in the model's directory, so a test can fill the cache.
"""

import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

HOLD_LIMIT_S = 30.0
KV_SLOTS = 8
GAUGE_PERIOD_S = 0.05


class TritonPythonModel:
    def initialize(self, args):
        self.directory = args["model_repository"]
        self.hold = os.path.join(self.directory, "hold")
        self.running = 0
        self.lock = threading.Lock()
        labels = {"model": args["model_name"], "version": args["model_version"]}
        names = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:gpu_cache_usage_perc")
        # A family must outlive its metrics (Triton refuses to set a metric of a deleted family).
        self.families = {
            n: pb_utils.MetricFamily(name=n, description=n, kind=pb_utils.MetricFamily.GAUGE) for n in names
        }
        self.gauges = {n: family.Metric(labels=labels) for n, family in self.families.items()}
        self.stopping = threading.Event()
        # Set before the model is ready: a scrape never sees the gauges' zero of before the first pass.
        self._set_gauges()
        threading.Thread(target=self._export, daemon=True).start()

    def finalize(self):
        self.stopping.set()

    def _export(self):
        while not self.stopping.wait(GAUGE_PERIOD_S):
            self._set_gauges()

    def _set_gauges(self):
        running = self.running
        self.gauges["vllm:num_requests_running"].set(running)
        self.gauges["vllm:num_requests_waiting"].set(self._override("waiting", 0.0))
        self.gauges["vllm:gpu_cache_usage_perc"].set(self._override("kv_cache", running / KV_SLOTS))

    def _override(self, name, default):
        try:
            with open(os.path.join(self.directory, name)) as written:
                return float(written.read())
        except (OSError, ValueError):
            return default

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self._generate, args=(request,), daemon=True).start()
        return None

    def _generate(self, request):
        with self.lock:
            self.running += 1
        try:
            self._stream(request)
        finally:
            with self.lock:
                self.running -= 1

    def _stream(self, request):
        sender = request.get_response_sender()
        try:
            prompt = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
            words = b" ".join(np.ravel(prompt)).decode("utf-8", "replace").split() or ["."]
            count = _scalar(request, "max_tokens", len(words))
            delay_s = _scalar(request, "token_delay_ms", 0.0) / 1000
            time.sleep(_scalar(request, "first_token_delay_ms", 0.0) / 1000)
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
