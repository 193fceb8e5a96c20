"""A real Open Inference Protocol (v2) server for the tests: KServe's Python model server answering an ONNX
classifier with onnxruntime, in its own virtual environment (``make venv-kserve``: KServe pins protobuf < 7,
pandas < 3 and python-dateutil < 3, which stealkit's environment has newer).

Configured by environment variables (KServe parses the command line itself): ``V2_ONNX`` (the model file),
``V2_NAME`` (the model's name), ``V2_PORT`` (HTTP port, bound on 127.0.0.1 by the test's choice of a free port),
``V2_LOG`` (a JSON-lines file: one row per answered request with its batch size, the server's own log of what it
answered), ``V2_OUTPUT`` (``logits``, ``probs`` or ``label``: what the model returns).
"""

import json
import os
import uuid

import numpy as np
import onnxruntime as ort
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer


class OnnxClassifier(Model):
    def __init__(self, name: str, path: str, output: str, log_path: str) -> None:
        super().__init__(name)
        self.session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        meta = self.session.get_inputs()[0]
        self.input_name = meta.name
        self.input_shape = [-1] + [int(s) for s in meta.shape[1:]]
        self.num_classes = int(self.session.get_outputs()[0].shape[1])
        self.output, self.log_path = output, log_path
        self.ready = True

    def get_input_types(self) -> list[dict]:
        return [{"name": self.input_name, "datatype": "FP32", "shape": self.input_shape}]

    def get_output_types(self) -> list[dict]:
        if self.output == "label":
            return [{"name": "label", "datatype": "INT64", "shape": [-1]}]
        return [{"name": self.output, "datatype": "FP32", "shape": [-1, self.num_classes]}]

    async def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
        x = payload.inputs[0].as_numpy().astype(np.float32)
        logits = self.session.run(None, {self.input_name: x})[0]
        if self.output == "label":
            out = logits.argmax(1).astype(np.int64)
        elif self.output == "probs":
            e = np.exp(logits - logits.max(1, keepdims=True))
            out = (e / e.sum(1, keepdims=True)).astype(np.float32)
        else:
            out = logits.astype(np.float32)
        kind = self.get_output_types()[0]
        result = InferOutput(name=kind["name"], shape=list(out.shape), datatype=kind["datatype"])
        result.set_data_from_numpy(out, binary_data=False)
        request_id = payload.id or uuid.uuid4().hex
        response = InferResponse(model_name=self.name, infer_outputs=[result], response_id=request_id)
        with open(self.log_path, "a", encoding="utf-8") as fh:  # logged once the answer exists
            fh.write(json.dumps({"id": request_id, "n": int(x.shape[0])}) + "\n")
        return response


if __name__ == "__main__":
    model = OnnxClassifier(os.environ["V2_NAME"], os.environ["V2_ONNX"], os.environ.get("V2_OUTPUT", "logits"),
                           os.environ["V2_LOG"])
    ModelServer(http_port=int(os.environ["V2_PORT"]), enable_grpc=False, workers=1).start([model])
