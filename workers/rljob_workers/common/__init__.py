"""What every pool server and the driver share: gRPC server and channel helpers, tokenizer loading,
device and dtype choice. Imports nothing of rljob but the api and the protos."""
