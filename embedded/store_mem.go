package embedded

import "github.com/kubemq-io/kubemq-proxy/kubemqpb"

type logStore struct{}

func openLogStore(string, *Server) (*logStore, error)                         { return &logStore{}, nil }
func (*logStore) close() error                                                { return nil }
func (*logStore) maintain()                                                   {}
func (s *Server) logQueueMsg(*kubemqpb.QueueMessage) (uint64, uint32)         { return 0, 0 }
func (s *Server) logQueueDel(string, []uint64)                                {}
func (s *Server) logDelayAdd(uint64, *kubemqpb.QueueMessage) (uint64, uint32) { return 0, 0 }
func (s *Server) logDelayDone([]uint64)                                       {}
func (s *Server) logEvent(*kubemqpb.EventReceive) (uint64, uint32)            { return 0, 0 }
func (s *Server) logCursor(string, string, uint64)                            {}
func (s *Server) releaseSeg(uint32)                                           {}
func (s *Server) waitLog(uint64) error                                        { return nil }
func (s *Server) applyRetention()                                             {}
