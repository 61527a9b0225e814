#!/bin/sh
# Builds the container image rate-limit:<version> FROM scratch with buildah (no registry, no
# daemon): the release inbound-web, the shared libraries ldd lists for it, CA certificates
# (for TLS to Redis), /etc/passwd naming the non-root user 65532, and a default configuration
# at /etc/rate-limit/config.toml (rate limiting disabled; mount yours over it). It runs as
# 65532:65532, writes nothing (a read-only root file system works), exposes 8080 (HTTP) and
# 8081 (gRPC, when [grpc] bind = "0.0.0.0:8081" is configured), and checks /healthz with the
# binary itself (inbound-web --probe). Docker image format, so the health check is kept.
#
#   cargo build --release -p inbound-web && deploy/image/build.sh [TAG]
#
# BIN= another binary; TAG defaults to rate-limit:<workspace version>. Prints the image's
# size and the build's time.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE="$ROOT/deploy/image"
BIN=${BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/inbound-web}
VERSION=$(sed -n '/^\[workspace.package\]/,/^\[/ s/^version = "\(.*\)"/\1/p' "$ROOT/Cargo.toml")
LICENSE=$(sed -n '/^\[workspace.package\]/,/^\[/ s/^license = "\(.*\)"/\1/p' "$ROOT/Cargo.toml")
TAG=${1:-rate-limit:$VERSION}
# Where the image comes from: the checkout's remote and commit (SOURCE= overrides the URL).
SOURCE=${SOURCE:-$(git -C "$ROOT" remote get-url origin 2>/dev/null || echo "local checkout")}
REVISION=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)
CA=${CA:-/etc/ssl/certs/ca-certificates.crt}
[ -x "$BIN" ] || { echo "no $BIN: cargo build --release -p inbound-web" >&2; exit 2; }
[ -f "$CA" ] || { echo "no CA bundle at $CA (Debian: ca-certificates); CA= another" >&2; exit 2; }
[ -n "${CONTAINERS_CONF:-}" ] || export CONTAINERS_CONF="$HERE/containers.conf"
started=$(date +%s.%N)
CTX=$(mktemp -d)
trap 'rm -rf "$CTX"' EXIT
R="$CTX/rootfs"
mkdir -p "$R/usr/local/bin" "$R/etc/rate-limit" "$R/etc/ssl/certs"
cp "$BIN" "$R/usr/local/bin/inbound-web"
# The loader and every library the binary links, at the paths it looks them up by.
for lib in $(ldd "$BIN" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'); do
  mkdir -p "$R$(dirname "$lib")"
  cp -L "$lib" "$R$lib"
done
cp "$CA" "$R/etc/ssl/certs/ca-certificates.crt"
printf 'nonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin\n' > "$R/etc/passwd"
printf 'nonroot:x:65532:\n' > "$R/etc/group"
cp "$HERE/config.toml" "$R/etc/rate-limit/config.toml"
cat > "$CTX/Containerfile" <<CONTAINERFILE
FROM scratch
COPY rootfs/ /
USER 65532:65532
EXPOSE 8080 8081
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
LABEL org.opencontainers.image.title="rate-limit" \\
      org.opencontainers.image.description="Distributed rate limiting: HTTP sidecar and Envoy RLS v3 (inbound-web)" \\
      org.opencontainers.image.version="$VERSION" \\
      org.opencontainers.image.source="$SOURCE" \\
      org.opencontainers.image.revision="$REVISION" \\
      org.opencontainers.image.licenses="$LICENSE"
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \\
  CMD ["/usr/local/bin/inbound-web", "--probe", "http://127.0.0.1:8080/healthz"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/inbound-web"]
CMD ["--config", "/etc/rate-limit/config.toml"]
CONTAINERFILE
buildah build --quiet --format docker --layers=false -t "$TAG" -f "$CTX/Containerfile" "$CTX" >/dev/null
finished=$(date +%s.%N)
size=$(podman image inspect --format '{{.Size}}' "$TAG")
binary=$(stat -c %s "$BIN")
awk -v t="$TAG" -v s="$size" -v b="$binary" -v a="$started" -v z="$finished" 'BEGIN {
  printf "%s: image %.1f MB, binary %.1f MB, built in %.1f s\n", t, s / 1e6, b / 1e6, z - a }'
