# Static kubemq-proxy binary on a minimal, non-root image.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/kubemq-proxy .

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/kubemq-proxy /kubemq-proxy
COPY config.yaml /etc/kubemq-proxy/config.yaml
# Pub/Sub, AMQP, AMQPS, HTTP side port, embedded KubeMQ gRPC.
EXPOSE 8085 5672 5671 9102 50000
USER nonroot:nonroot
ENTRYPOINT ["/kubemq-proxy", "--config", "/etc/kubemq-proxy/config.yaml"]
