FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY firsttoken firsttoken
COPY gateway gateway
COPY workers workers
COPY shared shared
COPY migrations migrations
RUN pip install --no-cache-dir .
ENV FIRSTTOKEN_HOST=0.0.0.0
EXPOSE 8000
CMD ["firsttoken", "gateway"]
