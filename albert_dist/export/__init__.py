"""`albert-dist export`: a trained model as ONNX (fp32, int8, fp16), checked against PyTorch at export."""
