// Command rollout is release tooling's main flow against Flotilla's API:
// change a FleetMicroservice's image with kubectl, then wait over gRPC
// (TLS and a bearer token) until the rollout of exactly that generation
// ends. Exit codes: 0 succeeded, 1 failed or rolled back, 2 deadline
// exceeded, 3 refused or unreachable, 64 usage.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	flotillav1 "example.io/flotilla/clients/go/flotilla/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// bearer sends the token with every call, over TLS only.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return true }

func main() {
	server := flag.String("server", "127.0.0.1:50051", "a Flotilla replica's gRPC address")
	ca := flag.String("ca", "", "PEM file of the CA that signed the server's certificate")
	serverName := flag.String("server-name", "", "the name the certificate must carry (default: the host)")
	tokenFile := flag.String("token-file", "", "file holding the bearer token")
	kubectl := flag.String("kubectl", "kubectl", "kubectl to edit the FleetMicroservice with")
	kubeconfig := flag.String("kubeconfig", "", "the home cluster's kubeconfig")
	namespace := flag.String("namespace", "default", "the FleetMicroservice's namespace")
	name := flag.String("name", "", "the FleetMicroservice")
	image := flag.String("image", "", "the image to roll out")
	timeout := flag.Duration("timeout", 5*time.Minute, "how long to wait for the rollout")
	flag.Parse()
	if *name == "" || *image == "" || *ca == "" || *tokenFile == "" {
		fmt.Fprintln(os.Stderr, "usage: rollout -ca CA -token-file FILE -name NAME -image IMAGE [flags]")
		os.Exit(64)
	}

	// 1. The change, as release tooling makes it: the generation it made
	//    is what the wait waits for.
	patch := fmt.Sprintf(`{"spec":{"template":{"image":%q}}}`, *image)
	cmd := exec.Command(*kubectl, "--kubeconfig", *kubeconfig, "-n", *namespace, "patch",
		"fleetmicroservices.platform.example.io", *name, "--type", "merge", "-p", patch,
		"-o", "jsonpath={.metadata.generation}")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubectl patch: %v\n", err)
		os.Exit(3)
	}
	generation, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubectl printed no generation: %q\n", out)
		os.Exit(3)
	}
	fmt.Printf("applied %s to %s/%s: generation %d\n", *image, *namespace, *name, generation)

	// 2. The wait, over TLS with the token.
	token, err := os.ReadFile(*tokenFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(64)
	}
	tls, err := credentials.NewClientTLSFromFile(*ca, *serverName)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(64)
	}
	conn, err := grpc.NewClient(*server, grpc.WithTransportCredentials(tls),
		grpc.WithPerRPCCredentials(bearer(strings.TrimSpace(string(token)))))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	}
	defer conn.Close()
	client := flotillav1.NewFleetRolloutsClient(conn)
	deadline := time.Now().Add(*timeout)
	for {
		code, retry := wait(client, *namespace, *name, generation, deadline)
		if retry == nil {
			os.Exit(code)
		}
		if time.Now().Add(*retry).After(deadline) {
			fmt.Fprintln(os.Stderr, "deadline exceeded while retrying")
			os.Exit(2)
		}
		time.Sleep(*retry)
	}
}

// wait follows one WaitForFleetRollout stream: an exit code, or how long
// to wait before asking again when the server said a retry helps.
func wait(client flotillav1.FleetRolloutsClient, namespace, name string, generation int64, deadline time.Time) (int, *time.Duration) {
	ctx, cancel := context.WithDeadline(context.Background(), deadline.Add(10*time.Second))
	defer cancel()
	stream, err := client.WaitForFleetRollout(ctx, &flotillav1.WaitForFleetRolloutRequest{
		Namespace: namespace,
		Name:      name,
		Target:    &flotillav1.WaitForFleetRolloutRequest_Generation{Generation: generation},
		Timeout:   durationpb.New(time.Until(deadline)),
	})
	if err != nil {
		return refused(err)
	}
	for {
		p, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			d := time.Second
			fmt.Fprintln(os.Stderr, "the stream ended before the rollout did")
			return 3, &d
		}
		if err != nil {
			return refused(err)
		}
		r := p.GetRollout()
		fmt.Printf("%s  phase %s  clusters updated %d/%d available %d/%d  %s\n",
			p.GetResult(), r.GetRolloutPhase(), r.GetClustersUpdated(), r.GetClustersPlaced(),
			r.GetClustersAvailable(), r.GetClustersPlaced(), p.GetSummary())
		switch p.GetResult() {
		case flotillav1.FleetRolloutResult_FLEET_ROLLOUT_RESULT_SUCCEEDED:
			return 0, nil
		case flotillav1.FleetRolloutResult_FLEET_ROLLOUT_RESULT_FAILED,
			flotillav1.FleetRolloutResult_FLEET_ROLLOUT_RESULT_ROLLED_BACK:
			return 1, nil
		case flotillav1.FleetRolloutResult_FLEET_ROLLOUT_RESULT_DEADLINE_EXCEEDED:
			return 2, nil
		}
	}
}

// refused reads an error's details: the stable reason decides, and
// RetryInfo says whether and when to ask again.
func refused(err error) (int, *time.Duration) {
	s := status.Convert(err)
	reason := ""
	var retry *time.Duration
	for _, d := range s.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			reason = d.GetReason()
		case *errdetails.RetryInfo:
			r := d.GetRetryDelay().AsDuration()
			if r < 200*time.Millisecond {
				r = 200 * time.Millisecond
			}
			retry = &r
		}
	}
	fmt.Fprintf(os.Stderr, "%s (%s): %s\n", s.Code(), reason, s.Message())
	return 3, retry
}
