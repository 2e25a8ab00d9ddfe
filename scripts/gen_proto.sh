#!/usr/bin/env bash
# Regenerate the Python gRPC/protobuf stubs in src/duetime/frontend/proto/.
#
#   scripts/gen_proto.sh            # from anywhere inside the repo
#   PROTOGEN_VENV=/path scripts/gen_proto.sh
#
# Pinned generator: grpcio-tools 1.74.0 (bundled protoc 31.1, i.e. protobuf
# Python gencode 6.31.1).  That gencode runs warning-free on any protobuf
# runtime 6.31 <= x < 7 (what tritonclient requires), and the _grpc.py it
# emits only needs grpcio >= 1.74.0.  Newer grpcio-tools releases emit
# protobuf-7 gencode, which the 6.x runtime refuses to load, so the tools are
# installed into a throwaway venv rather than the project environment.
#
# Post-processing (done below, idempotent because files are regenerated from
# scratch each run): the generated modules register their descriptors in a
# private DescriptorPool instead of protobuf's process-wide default pool.
# Both these files and tritonclient's own generated code define the symbols
# `inference.*`; in the default pool the second import fails with
# "duplicate symbol 'inference.DataType'", which would make duetime and
# tritonclient.grpc impossible to import in one process.  The wire format
# (field numbers/types, RPC paths `/inference.GRPCInferenceService/...`) is
# unaffected.  The pool is reachable as `model_config_pb2.DESCRIPTOR.pool`
# (e.g. for grpc reflection's `pool=` argument).
set -euo pipefail

GRPCIO_TOOLS_VERSION=1.74.0
EXPECTED_GENCODE=6.31.1

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PROTOGEN_VENV:-${TMPDIR:-/tmp}/duetime-protogen-${GRPCIO_TOOLS_VERSION}}"
PROTO_DIR=duetime/frontend/proto

if [[ ! -x "${VENV}/bin/python" ]]; then
  python3 -m venv "${VENV}"
fi
if ! "${VENV}/bin/python" -c "import grpc_tools" 2>/dev/null \
   || [[ "$("${VENV}/bin/pip" show grpcio-tools 2>/dev/null | sed -n 's/^Version: //p')" != "${GRPCIO_TOOLS_VERSION}" ]]; then
  "${VENV}/bin/pip" install --quiet "grpcio-tools==${GRPCIO_TOOLS_VERSION}"
fi

cd "${REPO_ROOT}/src"
rm -f "${PROTO_DIR}"/*_pb2.py "${PROTO_DIR}"/*_pb2.pyi "${PROTO_DIR}"/*_pb2_grpc.py

# Import paths are relative to src/, so generated imports read
# `from duetime.frontend.proto import ...`.
"${VENV}/bin/python" -m grpc_tools.protoc -I . \
  --python_out=. --pyi_out=. \
  "${PROTO_DIR}/model_config.proto"
"${VENV}/bin/python" -m grpc_tools.protoc -I . \
  --python_out=. --pyi_out=. --grpc_python_out=. \
  "${PROTO_DIR}/grpc_service.proto"

"${VENV}/bin/python" - "${PROTO_DIR}" "${EXPECTED_GENCODE}" <<'EOF'
import pathlib
import re
import sys

proto_dir = pathlib.Path(sys.argv[1])
expected = sys.argv[2]

DEFAULT_ADD = "DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile("
REWRITES = {
    # model_config.proto has no dependencies: it owns the private pool.
    "model_config_pb2.py": (
        "# duetime: private descriptor pool, see scripts/gen_proto.sh.\n"
        "_pool = _descriptor_pool.DescriptorPool()\n"
        "DESCRIPTOR = _pool.AddSerializedFile("
    ),
    # grpc_service.proto imports model_config.proto: use the same pool.
    "grpc_service_pb2.py": (
        "# duetime: private descriptor pool, see scripts/gen_proto.sh.\n"
        "_pool = duetime_dot_frontend_dot_proto_dot_model__config__pb2.DESCRIPTOR.pool\n"
        "DESCRIPTOR = _pool.AddSerializedFile("
    ),
}
for name, replacement in REWRITES.items():
    path = proto_dir / name
    text = path.read_text()
    version = re.search(r"^# Protobuf Python Version: (\S+)$", text, re.M)
    if version is None or version.group(1) != expected:
        sys.exit(f"{path}: expected gencode {expected}, got {version and version.group(1)}")
    if text.count(DEFAULT_ADD) != 1:
        sys.exit(f"{path}: expected exactly one default-pool registration")
    path.write_text(text.replace(DEFAULT_ADD, replacement))
EOF

echo "regenerated stubs in src/${PROTO_DIR} with grpcio-tools ${GRPCIO_TOOLS_VERSION}"
