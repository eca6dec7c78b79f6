GO ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
# The commit's time, so that builds of one commit are the same files.
BUILD_DATE ?= $(shell TZ=UTC git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ 2>/dev/null)
LDFLAGS := -X main.version=$(VERSION) -X main.revision=$(REVISION) -X main.buildDate=$(BUILD_DATE)

.PHONY: all build static image dist test test-containers fuzz run bench vet fmt-check postgres browser brokers clean

all: build

## build: the outbox-relay binary in bin/
build:
	$(GO) build -ldflags="$(LDFLAGS)" -o bin/outbox-relay ./cmd/outbox-relay

## static: a static binary, as the container image builds it
static:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags="-s -w $(LDFLAGS)" -o bin/outbox-relay-static ./cmd/outbox-relay

## dist: the release's files in dist/: static binaries for linux and darwin on amd64 and arm64 in archives, a CycloneDX SBOM of each, SHA256SUMS
dist:
	@VERSION=$(VERSION) REVISION=$(REVISION) BUILD_DATE=$(BUILD_DATE) scripts/dist

## image: the relay's image, outbox-relay:local, built FROM scratch without a registry (with a Docker engine: one is installed and started for the build when none answers)
image:
	@scripts/with-docker scripts/build-image outbox-relay:local

## test: vet, formatting, and every test with the race detector against a real PostgreSQL, the console in a real browser, and the container tests under a Docker engine (started for the run when none answers)
## (the tests link without debug information, which they do not use, and run one relay binary built once)
# The packages whose tests take longest go first (go test runs them in the
# order given, two at a time on two cores): the short ones fill in at the
# end rather than leaving a long one to finish alone, and the fault tests
# that mostly wait overlap with the ones that need the CPU.
SLOW_PACKAGES := ./relay ./cmd/outbox-relay ./internal/dev/bench ./relay/rabbitmq ./relaycontainer ./relay/nats ./relay/store ./relay/sqs
# The chart's test renders templates with Helm's and Kubernetes' packages,
# which nothing else compiles: it runs beside the rest, without the race
# detector (scripts/test).
NORACE_PACKAGES := ./internal/dev/charttest

test: postgres brokers browser fmt-check build
	OUTBOX_TEST_BROWSER=1 OUTBOX_TEST_CONTAINERS=1 OUTBOX_TEST_REDIS=1 OUTBOX_TEST_RABBITMQ=1 OUTBOX_TEST_SQS=1 \
	OUTBOX_TEST_RELAY_BINARY=$(CURDIR)/bin/outbox-relay \
	GO=$(GO) SLOW_PACKAGES="$(SLOW_PACKAGES)" NORACE_PACKAGES="$(NORACE_PACKAGES)" scripts/test

## test-containers: the container tests alone
test-containers: postgres
	OUTBOX_TEST_CONTAINERS=1 scripts/with-docker $(GO) test -race -count=1 -timeout 20m -run 'TestScenariosContainers|TestImage|TestRunReports|TestMigrateUpReports|TestOrderPlaced|TestDockerfiles|TestDocs' -v ./cmd/outbox-relay/ ./relaycontainer/ ./internal/dev/containertest/

## fuzz: the fuzz tests of what operators type (the API's requests, the console's forms, searches and filters), FUZZTIME each (default 1m); make test runs their seed corpora
FUZZTIME ?= 1m
fuzz: postgres
	$(GO) test -run '^$$' -fuzz '^FuzzAPI$$' -fuzztime $(FUZZTIME) ./api/
	$(GO) test -run '^$$' -fuzz '^FuzzConsole$$' -fuzztime $(FUZZTIME) ./console/
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./deadletter/

## run: a throwaway local stack with the relay at work (Ctrl-C stops and removes it); SINK=nats, pubsub, redis, rabbitmq or sqs sends the orders there instead of Kafka; CAPTURE=log writes them into the write-ahead log
SINK ?= kafka
CAPTURE ?= table
run: postgres build
	@if [ "$(SINK)" = redis ]; then scripts/ensure-redis; fi
	@if [ "$(SINK)" = rabbitmq ]; then scripts/ensure-rabbitmq; fi
	@if [ "$(SINK)" = sqs ]; then scripts/ensure-fauxqs; fi
	$(GO) build -o bin/localstack ./internal/dev/cmd/localstack
	bin/localstack -relay bin/outbox-relay -sink $(SINK) -capture $(CAPTURE)

## bench: end-to-end throughput and latency figures, written to bench-results/ (not a pass/fail test)
bench: postgres
	$(GO) run ./internal/dev/cmd/bench -out bench-results

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(find . -name '*.go' -not -path './.git/*')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

# Installs the PostgreSQL server binaries and PgBouncer when they are missing.
postgres:
	@scripts/ensure-postgres

browser:
	@scripts/ensure-chromium

## brokers: the servers the sinks' tests start (Redis, RabbitMQ from Debian's packages; the SQS and SNS emulator from npm)
brokers:
	@scripts/ensure-redis
	@scripts/ensure-rabbitmq
	@scripts/ensure-fauxqs

clean:
	rm -rf bin dist
