# kiln in a container: a portable build (-DKILN_NATIVE=OFF: the CPU kernels of every x86-64
# level, the best one chosen when it starts, so the image runs on any x86-64 machine at that
# machine's speed), installed into /opt/kiln on a slim Debian that has only the runtime libraries.
#
#   docker build -t kiln .
#   docker run --rm -v "$PWD:/out" kiln generate -o /out/bundled.png
#   docker run --rm -v ~/.cache/huggingface:/root/.cache/huggingface:ro -v "$PWD:/out" \
#     kiln generate --model flux1-schnell -p "a red fox in the snow" -o /out/fox.png
#   docker run --rm -p 7860:7860 -v ~/.cache/huggingface:/root/.cache/huggingface:ro \
#     kiln serve --model flux1-schnell --host 0.0.0.0 --api-key "$KILN_API_KEY"
FROM debian:bookworm AS build
WORKDIR /src
COPY scripts/install-deps.sh scripts/
RUN scripts/install-deps.sh --build --no-plugins && rm -rf /var/lib/apt/lists/*
COPY . .
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/opt/kiln \
          -DKILN_NATIVE=OFF -DKILN_BUILD_TESTS=OFF -DKILN_CUDA=OFF -DKILN_PJRT=OFF \
 && cmake --build /build \
 && cmake --install /build

FROM debian:bookworm-slim
COPY scripts/install-deps.sh /tmp/
RUN /tmp/install-deps.sh --runtime && rm -rf /var/lib/apt/lists/* /tmp/install-deps.sh
COPY --from=build /opt/kiln /opt/kiln
ENV PATH=/opt/kiln/bin:$PATH
ENTRYPOINT ["kiln"]
CMD ["--help"]
